//! `drover-bench containers`: how long a pyxis-style `srun --container-image=...` takes until its task's first line
//! of output arrives, with the node's image store empty (cold) and holding the image (warm), against a plain `srun`
//! and against `docker run` of the same images on the same machine; and N cold starts at once on one node, which
//! must import the image once.
//!
//! The images are built here, as `cli/tests/containers.rs` builds its own: the host's programs and their libraries
//! (the small image), plus incompressible random files over several layers (the big one, so that downloading
//! layers in parallel and unpacking them count). Debian's `docker-registry` serves them on loopback. Needs root (the
//! agent mounts containers only then) and the Debian packages docker-registry, skopeo and umoci.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{ArgAction, Args};
use drover_testkit::local::{LocalCluster, UpOptions, find_binary};

/// What every timed command prints; its arrival is the measurement.
const FIRST_LINE: &str = "first-line";
/// Each random file of the big image.
const BLOB_BYTES: u64 = 64 << 20;
/// Layers the big image's random files are spread over (the agent downloads up to 4 layers at once).
const BIG_LAYERS: u64 = 4;
/// Longest any single timed command may take before the bench gives up on it.
const PATIENCE: Duration = Duration::from_secs(600);

#[derive(Args, Debug, Clone)]
pub struct ContainersArgs {
    /// Work directory, emptied first and kept afterwards (default: a fresh one under the temp dir, removed after a
    /// successful run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Size of the synthetic big image in GiB (0: skip it).
    #[arg(long, default_value_t = 1)]
    pub big_gb: u64,
    /// Repetitions of every cold and every warm measurement.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// `srun`s started at once on the node for the concurrent cold start.
    #[arg(long, default_value_t = 4)]
    pub concurrent: usize,
    /// Compare with `docker run` of the same images (`--docker false` skips it; so does a failing `docker info`).
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub docker: bool,
}

/// One image of the bench: its tag in the OCI layout, its name in the registry and what it is made of.
struct Image {
    /// Short name for output: `small`, `big`.
    label: &'static str,
    /// Tag in the OCI layout.
    tag: &'static str,
    /// `REPO:TAG` in the registry and in docker.
    name: &'static str,
    /// Layer blob digests and their (compressed) sizes, from the layout's manifest.
    layers: Vec<(String, u64)>,
    /// Bytes of its files once unpacked.
    unpacked: u64,
}

impl Image {
    fn repo(&self) -> &str {
        self.name.split(':').next().unwrap_or(self.name)
    }

    fn describe(&self) -> String {
        let bytes: u64 = self.layers.iter().map(|(_, size)| size).sum();
        let layers = self.layers.len();
        format!(
            "{}: {:.1} MB gzip, {:.1} MB unpacked, {layers} layer{}",
            self.label,
            bytes as f64 / 1e6,
            self.unpacked as f64 / 1e6,
            if layers == 1 { "" } else { "s" }
        )
    }
}

/// Durations of repeated runs of one measurement.
#[derive(Clone, Default)]
struct Stats(Vec<Duration>);

impl Stats {
    fn sorted_ms(&self) -> Vec<f64> {
        let mut ms: Vec<f64> = self.0.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        ms
    }

    fn median_ms(&self) -> f64 {
        let ms = self.sorted_ms();
        match ms.len() {
            0 => 0.0,
            n if n % 2 == 1 => ms[n / 2],
            n => (ms[n / 2 - 1] + ms[n / 2]) / 2.0,
        }
    }

    /// `median ms (min–max)`, or `–` without runs.
    fn cell(&self) -> String {
        let ms = self.sorted_ms();
        match (ms.first(), ms.last()) {
            (Some(min), Some(max)) if ms.len() > 1 => {
                format!("{:.0} ms ({min:.0}–{max:.0})", self.median_ms())
            }
            (Some(only), _) => format!("{only:.0} ms"),
            _ => "–".into(),
        }
    }
}

/// One line of the final table.
struct Row {
    what: String,
    cold: Stats,
    warm: Stats,
    note: String,
}

pub async fn containers(args: ContainersArgs) -> anyhow::Result<()> {
    if args.runs == 0 || args.concurrent == 0 {
        bail!("--runs and --concurrent must be at least 1");
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("drover-bench containers needs root: the agent mounts containers only when it runs as root");
    }
    for (program, package) in [("docker-registry", "docker-registry"), ("skopeo", "skopeo"), ("umoci", "umoci")] {
        need(program, package)?;
    }
    need("tar", "tar")?;
    let keep = args.dir.is_some();
    let dir = crate::bench_dir(args.dir.clone(), "containers");
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    // The cluster's client files live below; every local user may reach them, as in the CLI's tests.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    machine_facts();
    let started = Instant::now();
    let mut rows = Vec::new();
    // Every process, cluster and docker image is owned by a guard inside `measure`, so they are gone by now even
    // when it failed.
    let result = measure(&args, &dir, &mut rows).await;
    print_table(&rows);
    println!("whole run: {:.0} s", started.elapsed().as_secs_f64());
    match &result {
        Ok(()) if !keep => {
            let _ = fs::remove_dir_all(&dir);
        }
        _ => println!("work directory kept: {}", dir.display()),
    }
    result
}

async fn measure(args: &ContainersArgs, dir: &Path, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let layout = dir.join("layout");
    let built = Instant::now();
    let rootfs = build_rootfs(dir)?;
    build_small(dir, &layout, &rootfs)?;
    let small_bytes = tree_bytes(&rootfs);
    let mut images = vec![Image {
        label: "small",
        tag: "small",
        name: "bench/small:v1",
        layers: layers(&layout, "small")?,
        unpacked: small_bytes,
    }];
    println!("built {} in {:.1} s", images[0].describe(), built.elapsed().as_secs_f64());
    if args.big_gb > 0 {
        let built = Instant::now();
        let random = build_big(dir, &layout, args.big_gb)?;
        let big = Image {
            label: "big",
            tag: "big",
            name: "bench/big:v1",
            layers: layers(&layout, "big")?,
            unpacked: small_bytes + random,
        };
        println!(
            "built {} in {:.1} s (random files of {} MiB, gzip layers made by umoci)",
            big.describe(),
            built.elapsed().as_secs_f64(),
            BLOB_BYTES >> 20
        );
        images.push(big);
    }
    let registry = Registry::start(dir)?;
    for image in &images {
        let pushed = Instant::now();
        push(&layout, image.tag, &registry.addr, image.name)?;
        println!(
            "pushed {} to {} in {:.1} s (skopeo, layers as built)",
            image.name,
            registry.addr,
            pushed.elapsed().as_secs_f64()
        );
    }

    let limit_mb = 20_000u64.max(args.big_gb * 2048 + 2048);
    let bench = Bench::up(dir, limit_mb).await?;
    let runs = args.runs;
    // The first job of a fresh cluster pays for connections and caches being set up, and the node's first container
    // for its first overlay mount and directories (0.4-0.7 s more than later cold runs here): no measurement should.
    // The cold runs empty the store before each run anyway.
    bench.timed(&["-N1", "echo", FIRST_LINE], &|| Ok(()))?;
    let warm_up = format!("--container-image={}#{}", registry.addr, images[0].name);
    bench.timed(&["-N1", &warm_up, "echo", FIRST_LINE], &|| Ok(()))?;

    let mut baseline = Stats::default();
    for _ in 0..runs {
        baseline.0.push(bench.timed(&["-N1", "echo", FIRST_LINE], &|| Ok(()))?);
    }
    println!("srun -N1 echo (no container): warm {} over {runs} runs", baseline.cell());
    rows.push(Row {
        what: "`srun -N1 echo`, no container".into(),
        cold: Stats::default(),
        warm: baseline,
        note: String::new(),
    });

    for image in &images {
        let flag = format!("--container-image={}#{}", registry.addr, image.name);
        let srun_args = ["-N1", flag.as_str(), "echo", FIRST_LINE];
        let mut cold = Stats::default();
        let from = registry.log_len();
        for _ in 0..runs {
            cold.0.push(bench.timed(&srun_args, &|| bench.clear_store())?);
        }
        let cold_downloads = registry.downloads(from, image);
        let mut warm = Stats::default();
        let from = registry.log_len();
        for _ in 0..runs {
            warm.0.push(bench.timed(&srun_args, &|| Ok(()))?);
        }
        let warm_downloads = registry.downloads(from, image);
        // Proof that cold was cold and warm was warm: every layer fetched once per cold run, never when warm.
        let note = format!(
            "layer downloads: cold {} (want {}), warm {} (want 0)",
            cold_downloads.iter().sum::<usize>(),
            runs * image.layers.len(),
            warm_downloads.iter().sum::<usize>()
        );
        println!("srun --container-image ({}): cold {}, warm {}; {note}", image.describe(), cold.cell(), warm.cell());
        rows.push(Row { what: format!("`srun --container-image` {}", image.describe()), cold, warm, note });
    }

    for image in &images {
        let row = concurrent(&bench, &registry, image, args.concurrent)?;
        rows.push(row);
    }
    // The cluster idles, but goes down anyway so the docker runs have the machine to themselves.
    drop(bench);

    if args.docker {
        docker_rows(&layout, &registry.addr, &images, runs, rows);
    }
    Ok(())
}

/// `docker run` of the same images on the same machine, when an engine answers.
fn docker_rows(layout: &Path, registry: &str, images: &[Image], runs: usize, rows: &mut Vec<Row>) {
    match docker_available() {
        Err(why) => println!("docker comparison skipped: {why}"),
        Ok(version) => {
            println!("docker: engine {version}");
            for image in images {
                match docker_bench(layout, registry, image, runs) {
                    Ok(row) => rows.push(row),
                    Err(e) => {
                        println!("docker run ({}): failed: {e:#}", image.label);
                        rows.push(Row {
                            what: format!("`docker run` {}", image.describe()),
                            cold: Stats::default(),
                            warm: Stats::default(),
                            note: format!("failed: {e:#}"),
                        });
                    }
                }
            }
        }
    }
}

/// N `srun`s of one uncached image at once on the one node: the wall time until every one printed, and how often
/// the image was imported (layer downloads in the registry's access log, entries in the store).
fn concurrent(bench: &Bench, registry: &Registry, image: &Image, n: usize) -> anyhow::Result<Row> {
    bench.clear_store()?;
    let from = registry.log_len();
    let flag = format!("--container-image={}#{}", registry.addr, image.name);
    // The task stays a moment after printing, so its task directory (and the supervisor's log with its "ready in"
    // line) is still there when read; the agent removes it once the job is over.
    let script = format!("echo {FIRST_LINE}; sleep 3");
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let command = bench.srun(&["-N1", &flag, "sh", "-c", &script]);
            let tx = tx.clone();
            std::thread::spawn(move || {
                let result = run_timed(command, "srun", start, Some(&tx));
                if result.is_err() {
                    let _ = tx.send(None);
                }
                result
            })
        })
        .collect();
    drop(tx);
    let mut arrivals = Vec::new();
    while arrivals.len() < n {
        match rx.recv_timeout(PATIENCE) {
            Ok(Some(at)) => arrivals.push(at),
            // A failed srun: its error comes from the join below.
            Ok(None) | Err(_) => break,
        }
    }
    let ready = ready_lines(&bench.state.join("tasks"));
    let mut failure = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some(anyhow::anyhow!("an srun thread panicked")),
        }
    }
    if let Some(e) = failure {
        return Err(e.context(format!("concurrent cold start of {}", image.name)));
    }
    let all = Stats(vec![arrivals.iter().copied().max().unwrap_or_default()]);
    let first = arrivals.iter().copied().min().unwrap_or_default();
    let downloads = registry.downloads(from, image);
    let imports = downloads.iter().copied().max().unwrap_or(0);
    let entries = bench.store_entries();
    let mut ready_ms = ready.clone();
    ready_ms.sort_unstable();
    let note = format!(
        "imports: {imports} of {n} (downloads per layer {downloads:?}; store entries {entries}; supervisors ready after \
         {ready_ms:?} ms); first printed after {:.0} ms",
        first.as_secs_f64() * 1e3
    );
    println!("{n} × srun at once, cold ({}): all printed after {}; {note}", image.describe(), all.cell());
    if imports != 1 || entries != 1 {
        println!("WARNING: expected exactly one import and one store entry");
    }
    Ok(Row {
        what: format!("{n} × `srun --container-image` at once, {}", image.describe()),
        cold: all,
        warm: Stats::default(),
        note,
    })
}

/// `docker run --rm IMAGE echo` for the same image: cold is `docker rmi`, then `docker pull` from the loopback
/// registry and the run, timed together; warm is the image loaded from the same OCI layout (`skopeo copy` to
/// `docker-daemon:`), after one untimed run.
fn docker_bench(layout: &Path, registry: &str, image: &Image, runs: usize) -> anyhow::Result<Row> {
    let remote = format!("{registry}/{}", image.name);
    let images = DockerImages(vec![image.name.to_string(), remote.clone()]);
    let mut cold = Stats::default();
    let mut notes = Vec::new();
    for _ in 0..runs {
        images.remove();
        let start = Instant::now();
        let pull = Command::new("docker").args(["pull", "-q", &remote]).output().context("cannot run docker pull")?;
        if !pull.status.success() {
            let why = String::from_utf8_lossy(&pull.stderr).trim().to_string();
            println!("docker cold runs skipped: docker pull {remote} failed: {why}");
            notes.push(format!("no cold: docker pull from the loopback registry failed ({why})"));
            cold.0.clear();
            break;
        }
        let run = docker_run(&remote);
        cold.0.push(run_timed(run, "docker run", start, None)?.first_line);
    }
    if !cold.0.is_empty() {
        notes.push("cold = rmi, then pull from the registry + run".into());
    }
    images.remove();
    let loaded = Instant::now();
    let out = Command::new("skopeo")
        .arg("copy")
        .arg(format!("oci:{}:{}", layout.display(), image.tag))
        .arg(format!("docker-daemon:{}", image.name))
        .output()
        .context("cannot run skopeo")?;
    if !out.status.success() {
        bail!("skopeo copy to docker-daemon:{} failed: {}", image.name, String::from_utf8_lossy(&out.stderr).trim());
    }
    notes.push(format!("loaded from the OCI layout in {:.1} s", loaded.elapsed().as_secs_f64()));
    run_timed(docker_run(image.name), "docker run", Instant::now(), None)?;
    let mut warm = Stats::default();
    for _ in 0..runs {
        warm.0.push(run_timed(docker_run(image.name), "docker run", Instant::now(), None)?.first_line);
    }
    let note = notes.join("; ");
    println!("docker run ({}): cold {}, warm {}; {note}", image.describe(), cold.cell(), warm.cell());
    Ok(Row { what: format!("`docker run` {}", image.describe()), cold, warm, note })
}

fn docker_run(image: &str) -> Command {
    let mut command = Command::new("docker");
    command.args(["run", "--rm", image, "echo", FIRST_LINE]);
    command
}

/// The engine's version, or why there is none to compare with.
fn docker_available() -> anyhow::Result<String> {
    let out = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}} (storage driver {{.Driver}})"])
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run docker: {e}"))?;
    if !out.status.success() {
        anyhow::bail!("docker info failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Docker images this bench made; removed when dropped (and between cold runs).
struct DockerImages(Vec<String>);

impl DockerImages {
    fn remove(&self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f"])
            .args(&self.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for DockerImages {
    fn drop(&mut self) {
        self.remove();
    }
}

/// When a timed command's first line arrived, measured from the given start.
struct Timed {
    first_line: Duration,
}

/// Spawns `command` and reads its stdout as it comes: the time from `start` to the arrival of [`FIRST_LINE`]
/// (also sent on `arrived`), once the command has exited successfully.
fn run_timed(
    mut command: Command,
    what: &str,
    start: Instant,
    arrived: Option<&mpsc::Sender<Option<Duration>>>,
) -> anyhow::Result<Timed> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().with_context(|| format!("cannot start {what}"))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        bail!("{what}: no pipes");
    };
    // stderr is drained on the side so a chatty command never blocks on it.
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    let mut stdout = BufReader::new(stdout);
    let (mut first, mut other, mut line) = (None, String::new(), String::new());
    loop {
        line.clear();
        match stdout.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) if first.is_none() && line.trim_end() == FIRST_LINE => {
                let at = start.elapsed();
                first = Some(at);
                if let Some(arrived) = arrived {
                    let _ = arrived.send(Some(at));
                }
            }
            Ok(_) => other.push_str(&line),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).with_context(|| format!("cannot read {what}'s output"));
            }
        }
    }
    let status = child.wait().with_context(|| format!("waiting for {what}"))?;
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        bail!("{what} failed ({status}): {}{}", other, errors.trim());
    }
    let Some(first_line) = first else {
        bail!("{what} never printed {FIRST_LINE:?}: stdout {other:?}, stderr {:?}", errors.trim());
    };
    Ok(Timed { first_line })
}

/// The "ready in N ms" figures the supervisors below `tasks` logged (`container IMAGE (DIGEST) ready in N ms`).
fn ready_lines(tasks: &Path) -> Vec<u64> {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<u64>) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) && depth < 4 {
                walk(&path, depth + 1, out);
            } else if entry.file_name() == "supervisor.log" {
                let text = fs::read_to_string(&path).unwrap_or_default();
                out.extend(text.lines().filter_map(|line| {
                    line.split_once(") ready in ")?.1.strip_suffix(" ms")?.trim().parse::<u64>().ok()
                }));
            }
        }
    }
    let mut out = Vec::new();
    walk(tasks, 0, &mut out);
    out
}

/// A one-controller, one-agent local cluster and the Slurm command shims that reach it; down when dropped.
struct Bench {
    cluster: LocalCluster,
    shims: PathBuf,
    drover_dir: PathBuf,
    work: PathBuf,
    /// The agent's state directory: its image store is `images/`, its containers' mounts `containers/`.
    state: PathBuf,
}

impl Bench {
    async fn up(dir: &Path, store_limit_mb: u64) -> anyhow::Result<Bench> {
        let options = UpOptions {
            controllers: 1,
            agents: 1,
            gpus_per_agent: 8,
            kill_wait_ms: 1_000,
            agent_toml: vec![format!("containers = {{ image_store_limit_mb = {store_limit_mb}, shm_mb = 64 }}")],
            ..UpOptions::default()
        };
        let cluster = LocalCluster::up(&dir.join("cluster"), options)?;
        let state = cluster
            .processes
            .iter()
            .find(|p| p.role == "agent")
            .map(|p| p.data_dir.clone())
            .context("the local cluster has no agent")?;
        let drover = find_binary("drover")?;
        let drover_dir = drover.parent().context("the drover binary's directory")?.to_path_buf();
        let bench = Bench { cluster, shims: dir.join("bin"), drover_dir, work: dir.join("work"), state };
        bench.cluster.wait_ready(Duration::from_secs(60)).await?;
        bench.cluster.wait_agents(Duration::from_secs(60)).await?;
        let out = Command::new(&drover).arg("install-shims").arg(&bench.shims).output()?;
        if !out.status.success() {
            bail!("drover install-shims failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        fs::create_dir_all(&bench.work)?;
        Ok(bench)
    }

    /// `srun ARGS` timed to its first line, after `prepare`.
    fn timed(&self, args: &[&str], prepare: &dyn Fn() -> anyhow::Result<()>) -> anyhow::Result<Duration> {
        prepare()?;
        Ok(run_timed(self.srun(args), "srun", Instant::now(), None)?.first_line)
    }

    /// `srun ARGS` from the work directory, aimed at this cluster.
    fn srun(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.shims.join("srun"));
        command
            .args(args)
            .current_dir(&self.work)
            .env("DROVER_CONTROLLERS", self.cluster.addresses())
            .env("DROVER_CONFIG", self.cluster.dir.join("client.toml"))
            .env(
                "PATH",
                format!("{}:{}:/usr/sbin:/usr/bin:/sbin:/bin", self.shims.display(), self.drover_dir.display()),
            )
            .env_remove("SLURM_JOB_ID");
        command
    }

    /// Waits until the agent has unmounted and removed the containers of finished jobs (it does so shortly after a
    /// job has left the node).
    fn wait_containers_gone(&self, patience: Duration) -> anyhow::Result<()> {
        let containers = self.state.join("containers");
        let waiting = Instant::now();
        while fs::read_dir(&containers).is_ok_and(|mut d| d.next().is_some()) {
            if waiting.elapsed() > patience {
                bail!(
                    "the agent did not remove its finished containers under {} in {patience:?}",
                    containers.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Makes the next container start cold: once no container is mounted (their overlays use the store as lower
    /// dir), deletes the whole store; the next task recreates it.
    fn clear_store(&self) -> anyhow::Result<()> {
        self.wait_containers_gone(Duration::from_secs(60))?;
        let store = self.state.join("images");
        // The agent looks at its store now and then (for scontrol show node): a removal racing that look finds a
        // directory made again under it, and is simply tried again.
        let mut attempt = 0;
        loop {
            match fs::remove_dir_all(&store) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(_) if attempt < 10 => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e).with_context(|| format!("cannot empty the image store {}", store.display())),
            }
        }
    }

    /// Complete images in the store.
    fn store_entries(&self) -> usize {
        let Ok(entries) = fs::read_dir(self.state.join("images")) else { return 0 };
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sha256-") && e.path().join("complete").exists())
            .count()
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // The agent unmounts the containers of the last jobs only a moment after they ended; a cluster taken down
        // before that would leave their overlays mounted.
        if let Err(e) = self.wait_containers_gone(Duration::from_secs(30)) {
            eprintln!("{e:#}");
        }
        if let Err(e) = self.cluster.down() {
            eprintln!("stopping the local cluster in {}: {e:#}", self.cluster.dir.display());
        }
        unmount_below(&self.state.join("containers"));
    }
}

/// Detaches whatever is still mounted below `dir` (the overlays of containers an agent did not get to remove).
fn unmount_below(dir: &Path) {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // Field 5 is the mount point (spaces and the like octal-escaped; the bench's own paths have none).
    let mut points: Vec<&str> =
        mountinfo.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| Path::new(p).starts_with(dir)).collect();
    // Deepest first.
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let Ok(target) = std::ffi::CString::new(point) else { continue };
        // SAFETY: a valid C string; a detached unmount leaves nothing half done for a process still inside.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!("cannot unmount {point}: {}", std::io::Error::last_os_error());
        }
    }
}

/// A `docker-registry` on a free loopback port, storing under the work directory, its access log in a file;
/// killed when dropped.
struct Registry {
    child: Child,
    addr: String,
    access_log: PathBuf,
}

impl Registry {
    fn start(dir: &Path) -> anyhow::Result<Registry> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.join("registry.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.join("registry-data").display()
            ),
        )?;
        // The access log (one line per request, written when it completes) goes to stdout, errors to stderr.
        let access_log = dir.join("registry-access.log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(File::create(&access_log)?)
            .stderr(File::create(dir.join("registry.log"))?)
            .spawn()
            .context("cannot start docker-registry")?;
        let registry = Registry { child, addr, access_log };
        let start = Instant::now();
        while std::net::TcpStream::connect(&registry.addr).is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                bail!("docker-registry did not listen on {} within 20 s; see {}", registry.addr, dir.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }

    fn log_len(&self) -> u64 {
        fs::metadata(&self.access_log).map_or(0, |m| m.len())
    }

    /// Successful downloads of each of `image`'s layers since the access log was `from` bytes long.
    fn downloads(&self, from: u64, image: &Image) -> Vec<usize> {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.access_log) {
            use std::io::Seek;
            let _ = file.seek(std::io::SeekFrom::Start(from));
            let _ = file.read_to_string(&mut text);
        }
        image
            .layers
            .iter()
            .map(|(digest, _)| {
                let request = format!("\"GET /v2/{}/blobs/{digest} HTTP/1.1\" ", image.repo());
                text.lines()
                    .filter_map(|l| l.split_once(&request))
                    .filter(|(_, status)| status.starts_with("200") || status.starts_with("206"))
                    .count()
            })
            .collect()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn need(program: &str, package: &str) -> anyhow::Result<()> {
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .any(|dir| Path::new(dir).join(program).exists());
    if !found {
        bail!("{program} is missing: install the Debian package {package} (apt-get install -y {package})");
    }
    Ok(())
}

/// Runs a build step; its stderr is the error.
fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!("{program} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The small image's tree: the host's own programs and the libraries they load (about 10 MB on Debian).
fn build_rootfs(dir: &Path) -> anyhow::Result<PathBuf> {
    let root = dir.join("rootfs");
    for sub in ["bin", "usr/bin", "etc", "tmp", "proc", "sys", "dev", "opt/app"] {
        fs::create_dir_all(root.join(sub))?;
    }
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    for name in ["sh", "echo", "cat", "ls", "id", "env", "sleep", "grep"] {
        let host = ["/bin", "/usr/bin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists())
            .with_context(|| format!("the host has no {name} to put in the image"))?;
        let host = fs::canonicalize(&host)?;
        fs::copy(&host, root.join("bin").join(name)).with_context(|| format!("copying {}", host.display()))?;
        let ldd = Command::new("ldd").arg(&host).output().context("cannot run ldd")?;
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            let Some(lib) = line.split_whitespace().find(|w| w.starts_with('/')) else { continue };
            let target = root.join(lib.trim_start_matches('/'));
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            if !target.exists() {
                fs::copy(lib, &target).with_context(|| format!("copying {lib}"))?;
            }
        }
    }
    fs::write(root.join("etc/os-release"), "PRETTY_NAME=\"Drover bench image\"\n")?;
    fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    fs::write(root.join("etc/group"), "root:x:0:\n")?;
    Ok(root)
}

/// The OCI layout with tag `small`: `rootfs` as one layer (umoci), with a PATH in its config.
fn build_small(dir: &Path, layout: &Path, rootfs: &Path) -> anyhow::Result<()> {
    let _ = fs::remove_dir_all(layout);
    let image = format!("{}:small", layout.display());
    let bundle = dir.join("bundle");
    let _ = fs::remove_dir_all(&bundle);
    let bundle_s = bundle.display().to_string();
    run("umoci", &["init", "--layout", &layout.display().to_string()])?;
    run("umoci", &["new", "--image", &image])?;
    run("umoci", &["unpack", "--rootless", "--image", &image, &bundle_s])?;
    fs::remove_dir_all(bundle.join("rootfs"))?;
    run("cp", &["-a", &rootfs.display().to_string(), &bundle.join("rootfs").display().to_string()])?;
    run("umoci", &["repack", "--image", &image, &bundle_s])?;
    run("umoci", &["config", "--image", &image, "--config.env", "PATH=/bin:/usr/bin", "--config.workingdir", "/"])?;
    fs::remove_dir_all(&bundle)?;
    Ok(())
}

/// Tag `big`: the small image plus `gb` GiB of random files (64 MiB each) spread over [`BIG_LAYERS`] layers,
/// each added as a tar with `umoci raw add-layer` (which gzips it).
fn build_big(dir: &Path, layout: &Path, gb: u64) -> anyhow::Result<u64> {
    let files = ((gb << 30) / BLOB_BYTES).max(1);
    let staging = dir.join("big-staging");
    // Seeded from the clock: no earlier run's layers (in docker, say) can match this run's.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let mut rng = SplitMix(seed);
    for layer in 0..BIG_LAYERS {
        let count = files / BIG_LAYERS + u64::from(layer < files % BIG_LAYERS);
        if count == 0 {
            continue;
        }
        let root = staging.join(format!("layer{layer}"));
        let data = root.join("data").join(format!("part{layer}"));
        fs::create_dir_all(&data)?;
        for i in 0..count {
            write_random(&data.join(format!("blob{i:03}.bin")), BLOB_BYTES, &mut rng)?;
        }
        let tar = staging.join(format!("layer{layer}.tar"));
        let tar_s = tar.display().to_string();
        run(
            "tar",
            &["--owner=0", "--group=0", "--numeric-owner", "-C", &root.display().to_string(), "-cf", &tar_s, "data"],
        )?;
        fs::remove_dir_all(&root)?;
        // The first random layer goes on top of the small image under the new tag; the rest on top of that.
        let (from, new_tag) = if layer == 0 { ("small", Some("big")) } else { ("big", None) };
        let image = format!("{}:{from}", layout.display());
        let mut args = vec!["raw", "add-layer", "--image", image.as_str()];
        if let Some(tag) = new_tag {
            args.extend(["--tag", tag]);
        }
        args.push(&tar_s);
        run("umoci", &args)?;
        fs::remove_file(&tar)?;
    }
    let _ = fs::remove_dir_all(&staging);
    Ok(files * BLOB_BYTES)
}

/// Bytes of the regular files below `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// splitmix64: fast enough that generating the big image costs little next to gzip, and incompressible to it.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn write_random(path: &Path, bytes: u64, rng: &mut SplitMix) -> anyhow::Result<()> {
    let mut file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            chunk.copy_from_slice(&rng.next().to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        file.write_all(&buf[..n]).with_context(|| format!("cannot write {}", path.display()))?;
        left -= n as u64;
    }
    Ok(())
}

/// Layer digests and sizes of tag `tag` in the OCI layout (index, then manifest).
fn layers(layout: &Path, tag: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let blob = |digest: &str| -> anyhow::Result<serde_json::Value> {
        let hex = digest.strip_prefix("sha256:").with_context(|| format!("unexpected digest {digest}"))?;
        let path = layout.join("blobs/sha256").join(hex);
        let text = fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("{} is not JSON", path.display()))
    };
    let index: serde_json::Value = serde_json::from_slice(&fs::read(layout.join("index.json"))?)?;
    let manifest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .and_then(|m| m["digest"].as_str())
        .with_context(|| format!("no tag {tag} in {}", layout.display()))?;
    let manifest = blob(manifest)?;
    let layers = manifest["layers"]
        .as_array()
        .with_context(|| format!("the manifest of {tag} has no layers"))?
        .iter()
        .filter_map(|l| Some((l["digest"].as_str()?.to_string(), l["size"].as_u64()?)))
        .collect();
    Ok(layers)
}

/// Pushes tag `tag` of the layout to `registry` as `name`, layers as they are (skopeo recompresses nothing here).
fn push(layout: &Path, tag: &str, registry: &str, name: &str) -> anyhow::Result<()> {
    run(
        "skopeo",
        &[
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            &format!("oci:{}:{tag}", layout.display()),
            &format!("docker://{registry}/{name}"),
        ],
    )
}

/// Cores, CPU model, memory and kernel, and which build of the cluster's binaries runs.
fn machine_facts() {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 =
        meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:")?.split_whitespace().next()?.parse().ok()).unwrap_or(0);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let agent = find_binary("drover-agent").map_or_else(|e| format!("({e})"), |p| p.display().to_string());
    println!(
        "machine: {cores} cores, {model}, {:.1} GiB memory, Linux {}; agent binary {agent}",
        mem_kib as f64 / (1 << 20) as f64,
        kernel.trim()
    );
}

fn print_table(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!();
    println!(
        "| measurement (time to the first line of output) | cold: median (min–max) | warm: median (min–max) | notes |"
    );
    println!("|---|---|---|---|");
    for row in rows {
        println!("| {} | {} | {} | {} |", row.what, row.cold.cell(), row.warm.cell(), row.note);
    }
    println!();
}
