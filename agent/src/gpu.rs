//! GPU discovery and health behind one trait, so the rest of the agent never knows whether it talks to NVML, to a
//! simulated node (tests, drills, laptops) or to the inventory the config promises when the driver is missing.
//!
//! The agent asks a [`GpuBackend`] for the inventory once at registration (and compares it with the config through
//! [`check_inventory`]) and for health on every poll; [`unhealthy`] turns a poll into the GPUs it must withhold.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use drover_state::GpuInfo;
use drover_state::job::{ClockLevel, GpuFreq};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};
use serde::{Deserialize, Serialize};

/// Hotter than this (strictly) and a GPU throttles hard or is about to shut itself down; jobs placed there run slow
/// and drag every rank of a collective with them.
pub const MAX_TEMPERATURE_C: u32 = 90;

/// Upper bound of events drained from one GPU's event set per poll, so a GPU storming XIDs cannot stall the poll.
const MAX_XID_EVENTS_PER_POLL: usize = 256;

/// Memory of the simulated model when the model name is not one we know.
const DEFAULT_SIMULATED_MEMORY_MB: u64 = 143_771;

/// Temperature every simulated GPU idles at; a realistic value so dashboards show something plausible.
const SIMULATED_IDLE_TEMPERATURE_C: u32 = 34;

/// Health of one GPU at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GpuHealth {
    pub index: u32,
    /// `None` when the backend cannot read it (no sensor, or a configured inventory without NVML).
    pub temperature_c: Option<u32>,
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
    /// XID codes seen since the previous poll.
    pub xid_events: Vec<u64>,
    /// `Some(reason)` when this GPU should not be given to jobs.
    pub problem: Option<String>,
    /// Percent of the last sample period a kernel ran (NVML's utilization rate); `None` when unreadable.
    #[serde(default)]
    pub utilization_pct: Option<u32>,
    /// Device memory in use, in MiB; `None` when unreadable.
    #[serde(default)]
    pub memory_used_mb: Option<u64>,
}

#[derive(thiserror::Error, Debug)]
pub enum GpuError {
    #[error("NVIDIA driver not found ({0})")]
    NoDriver(String),
    #[error("NVML call {call} failed: {message}")]
    Nvml { call: &'static str, message: String },
    #[error("GPU inventory does not match the config: {0}")]
    InventoryMismatch(String),
}

/// Discovery and health of the GPUs of this node.
pub trait GpuBackend: Send + Sync {
    /// Short description for logs: "NVML 12.x driver 550.54" / "simulated (8 GPUs)".
    fn describe(&self) -> String;
    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// Polls health; XID events collected since the previous poll.
    fn health(&self) -> Result<Vec<GpuHealth>, GpuError>;
    /// The processes that hold GPU `index` now (NVML's compute-process list): a GPU is free for a new task only
    /// when this is empty. `Err` where the backend cannot know (no driver): the agent then relies on its own task
    /// records alone.
    fn compute_processes(&self, index: u32) -> Result<Vec<u32>, GpuError>;
    /// Variables every task given these GPUs carries beside Slurm's. Real GPUs need none; a simulated node marks its
    /// tasks so that it can tell its own GPUs' holders from those of another simulated node on the same host.
    fn task_environment(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Sets GPU `index`'s application clocks as `--gpu-freq` asks ([`choose_clocks`]); says what was set.
    fn set_clocks(&self, index: u32, freq: &GpuFreq) -> Result<Clocks, GpuError>;
    /// Back to the driver's default application clocks (a job that asked for none runs at those).
    fn reset_clocks(&self, index: u32) -> Result<(), GpuError>;
    /// GPU `index`'s application clocks now.
    fn clocks(&self, index: u32) -> Result<Clocks, GpuError>;
}

/// A GPU's application clocks: what its kernels run at, within its power and thermal limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clocks {
    pub memory_mhz: u32,
    pub graphics_mhz: u32,
}

/// The clocks `freq` asks for on a GPU that supports `memory` clocks and, for each, the graphics clocks
/// `graphics_for` lists: the memory clock first (the highest unless asked), then a graphics clock valid with it
/// (likewise). `None` when the GPU lists no clock to choose from.
pub fn choose_clocks(
    freq: &GpuFreq,
    memory: &[u32],
    graphics_for: impl FnOnce(u32) -> Result<Vec<u32>, GpuError>,
) -> Result<Option<Clocks>, GpuError> {
    let Some(memory_mhz) = freq.memory.unwrap_or(ClockLevel::High).pick(memory) else { return Ok(None) };
    let graphics = graphics_for(memory_mhz)?;
    Ok(freq
        .graphics
        .unwrap_or(ClockLevel::High)
        .pick(&graphics)
        .map(|graphics_mhz| Clocks { memory_mhz, graphics_mhz }))
}

/// The variable that marks the tasks of one simulated node (see [`SimulatedBackend::with_host_marker`]).
pub const SIMULATED_NODE_VAR: &str = "DROVER_SIMULATED_NODE";

/// What the agent's config says the node should have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ExpectedGpus {
    pub count: Option<u32>,
    /// Matched case-insensitively, so a config written with the `--gres` type (`h200`) matches `NVIDIA H200`.
    pub model_contains: Option<String>,
}

/// Picks the backend: simulated when `simulate` is `Some(n)`, otherwise NVML; when NVML cannot be opened, the
/// inventory the config promises (with one warning saying so), never a silent zero.
pub fn open_backend(
    simulate: Option<u32>,
    node_name: &str,
    host_marker: &str,
    expected: &ExpectedGpus,
) -> Box<dyn GpuBackend> {
    if let Some(count) = simulate {
        let model = expected.model_contains.as_deref().unwrap_or("H200");
        let backend = SimulatedBackend::new(count, model, node_name).with_host_marker(host_marker);
        tracing::info!(backend = %backend.describe(), "GPU backend: simulated");
        return Box::new(backend);
    }
    match NvmlBackend::open() {
        Ok(backend) => {
            tracing::info!(backend = %backend.describe(), "GPU backend: NVML");
            Box::new(backend)
        }
        Err(err) => {
            // One line that says what happened and what the node will advertise: an operator reading the log of a
            // node that shows the wrong GPU count must find the reason here without knowing the code.
            let backend = SimulatedBackend::configured(expected, node_name);
            match expected.count {
                Some(count) => tracing::warn!(
                    "NVML unavailable: {err}; using the configured inventory of {count} GPUs ({}) without health \
                     monitoring",
                    backend.model_name()
                ),
                None => tracing::warn!(
                    "NVML unavailable: {err}; no GPU count is configured either, so this node advertises ZERO GPUs \
                     (install the NVIDIA driver or configure the expected GPU count)"
                ),
            }
            Box::new(backend)
        }
    }
}

/// Compares a discovered inventory with the config and names exactly what differs.
pub fn check_inventory(found: &[GpuInfo], expected: &ExpectedGpus) -> Result<(), GpuError> {
    if let Some(count) = expected.count
        && found.len() != count as usize
    {
        let mut indices: Vec<u32> = found.iter().map(|g| g.index).collect();
        indices.sort_unstable();
        let mut detail = format!("indices {}", index_ranges_or_none(&indices));
        let missing: Vec<u32> = (0..count).filter(|i| !indices.contains(i)).collect();
        let extra: Vec<u32> = indices.iter().copied().filter(|&i| i >= count).collect();
        if !missing.is_empty() {
            let _ = write!(detail, "; missing {}?", plural_indices(&missing));
        }
        if !extra.is_empty() {
            let _ = write!(detail, "; unexpected {}?", plural_indices(&extra));
        }
        return Err(GpuError::InventoryMismatch(format!(
            "config expects {count} GPUs but found {} ({detail})",
            found.len()
        )));
    }
    if let Some(model) = &expected.model_contains {
        let wanted = model.to_lowercase();
        let wrong: Vec<String> = found
            .iter()
            .filter(|g| !g.name.to_lowercase().contains(&wanted))
            .map(|g| format!("GPU {} is {:?}", g.index, g.name))
            .collect();
        if !wrong.is_empty() {
            return Err(GpuError::InventoryMismatch(format!(
                "{}, config expects a model containing {model:?}",
                wrong.join(", ")
            )));
        }
    }
    Ok(())
}

/// GPU indices whose latest health has a problem, with the reason (the agent withholds them or drains the node).
pub fn unhealthy(health: &[GpuHealth]) -> Vec<(u32, String)> {
    health.iter().filter_map(|h| h.problem.clone().map(|reason| (h.index, reason))).collect()
}

/// The one place health thresholds are applied, shared by both backends so a simulated drill exercises exactly the
/// rules production uses. XIDs are not judged here: they are events the agent classifies with its XID table (see
/// `crate::xid`), which decides whether one GPU, the node or only the job pays for them.
fn assess(temperature_c: Option<u32>, ecc_uncorrected: u64) -> Vec<String> {
    let mut problems = Vec::new();
    // Any uncorrectable error means some job already read corrupt memory; the page may not be retired yet.
    if ecc_uncorrected > 0 {
        problems.push(format!("uncorrectable ECC errors: {ecc_uncorrected}"));
    }
    if let Some(t) = temperature_c
        && t > MAX_TEMPERATURE_C
    {
        problems.push(format!("temperature {t} C above limit {MAX_TEMPERATURE_C} C"));
    }
    problems
}

fn join_problems(problems: Vec<String>) -> Option<String> {
    if problems.is_empty() { None } else { Some(problems.join("; ")) }
}

fn plural_indices(indices: &[u32]) -> String {
    let list: Vec<String> = indices.iter().map(u32::to_string).collect();
    if list.len() == 1 { format!("index {}", list[0]) } else { format!("indices {}", list.join(", ")) }
}

/// Health state is plain data that stays consistent between statements, so a panic elsewhere while the lock was held
/// leaves nothing half-updated; carrying on beats taking the agent down over a poisoned lock.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn nvml_error(call: &'static str) -> impl FnOnce(NvmlError) -> GpuError {
    move |err| GpuError::Nvml { call, message: err.to_string() }
}

/// The real GPUs, through the NVIDIA driver's management library.
pub struct NvmlBackend {
    /// Leaked on purpose: NVML's event sets borrow the library handle, and they must live as long as the backend
    /// (an XID raised between polls is only queued on a set registered before it happened). A backend is opened once
    /// per agent process, so the leak is one small allocation, and the driver is released at process exit.
    nvml: &'static Nvml,
    description: String,
    poll: Mutex<NvmlPollState>,
}

struct NvmlPollState {
    /// One set per GPU rather than one shared set: a failed registration releases the set it was given, and one GPU
    /// that cannot report XIDs must not cost the others theirs. The index also saves a lookup per event.
    xid_sets: Vec<(u32, EventSet<'static>)>,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so`, initialises NVML and registers for critical XID events on every GPU.
    pub fn open() -> Result<NvmlBackend, GpuError> {
        let nvml = Nvml::init().map_err(|err| match err {
            NvmlError::LibloadingError(e) => GpuError::NoDriver(format!("libnvidia-ml.so could not be loaded: {e}")),
            NvmlError::LibraryNotFound => GpuError::NoDriver("libnvidia-ml.so could not be found".to_string()),
            NvmlError::DriverNotLoaded => {
                GpuError::NoDriver("libnvidia-ml.so loaded but the NVIDIA kernel driver is not running".to_string())
            }
            other => GpuError::Nvml { call: "nvmlInit_v2", message: other.to_string() },
        })?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        // Versions only decorate the log line; a driver that cannot tell them is still usable.
        let nvml_version = nvml.sys_nvml_version().unwrap_or_else(|_| "unknown".to_string());
        let driver_version = nvml.sys_driver_version().unwrap_or_else(|_| "unknown".to_string());
        let count = nvml.device_count().map_err(nvml_error("nvmlDeviceGetCount"))?;
        let xid_sets = register_xid_events(nvml, count);
        Ok(NvmlBackend {
            nvml,
            description: format!("NVML {nvml_version} driver {driver_version}"),
            poll: Mutex::new(NvmlPollState { xid_sets }),
        })
    }

    fn gpu_info(&self, index: u32) -> Result<GpuInfo, GpuError> {
        let device = self.nvml.device_by_index(index).map_err(nvml_error("nvmlDeviceGetHandleByIndex"))?;
        Ok(GpuInfo {
            index,
            uuid: device.uuid().map_err(nvml_error("nvmlDeviceGetUUID"))?,
            name: device.name().map_err(nvml_error("nvmlDeviceGetName"))?,
            memory_mb: device.memory_info().map_err(nvml_error("nvmlDeviceGetMemoryInfo"))?.total / (1024 * 1024),
            pci_bus_id: device.pci_info().map_err(nvml_error("nvmlDeviceGetPciInfo"))?.bus_id,
        })
    }

    /// Reads one GPU. A GPU that is lost becomes a problem on that GPU rather than an error for the whole poll: the
    /// other GPUs are fine, and the agent must learn which one to withhold.
    fn gpu_health(&self, index: u32, xids: &[u64]) -> Result<GpuHealth, GpuError> {
        let mut lost = None;
        let device = match self.nvml.device_by_index(index) {
            Ok(device) => Some(device),
            Err(NvmlError::GpuLost) => {
                lost = Some("GPU lost: it has fallen off the bus or is otherwise inaccessible".to_string());
                None
            }
            Err(err) => return Err(nvml_error("nvmlDeviceGetHandleByIndex")(err)),
        };
        let (mut temperature_c, mut ecc_corrected, mut ecc_uncorrected) = (None, 0, 0);
        if let Some(device) = &device {
            temperature_c = match device.temperature(TemperatureSensor::Gpu) {
                Ok(t) => Some(t),
                Err(NvmlError::GpuLost) => {
                    lost.get_or_insert_with(|| "GPU lost while reading its temperature".to_string());
                    None
                }
                // A missing sensor is not a reason to withhold a GPU; the other checks still apply.
                Err(err) => {
                    tracing::debug!(gpu = index, "temperature unavailable: {err}");
                    None
                }
            };
            // Volatile counters count since the driver loaded; the agent holds NVML open, so that is at least since
            // the agent started. Aggregate (lifetime) counters would keep a GPU out forever for an error that a
            // page retirement and a reset already dealt with.
            for (kind, count) in
                [(MemoryError::Corrected, &mut ecc_corrected), (MemoryError::Uncorrected, &mut ecc_uncorrected)]
            {
                *count = match device.total_ecc_errors(kind, EccCounter::Volatile) {
                    Ok(n) => n,
                    // Consumer and some workstation GPUs have no ECC, or run with it off: nothing to count.
                    Err(NvmlError::NotSupported) => 0,
                    Err(NvmlError::GpuLost) => {
                        lost.get_or_insert_with(|| "GPU lost while reading its ECC counters".to_string());
                        0
                    }
                    Err(err) => return Err(nvml_error("nvmlDeviceGetTotalEccErrors")(err)),
                };
            }
        }
        // Load figures are for operators (metrics), never a reason to withhold a GPU: unreadable is simply unknown.
        let utilization_pct = device.as_ref().and_then(|d| d.utilization_rates().ok()).map(|u| u.gpu);
        let memory_used_mb = device.as_ref().and_then(|d| d.memory_info().ok()).map(|m| m.used >> 20);
        let mut problems = assess(temperature_c, ecc_uncorrected);
        if let Some(lost) = lost {
            problems.insert(0, lost);
        }
        Ok(GpuHealth {
            index,
            temperature_c,
            ecc_corrected,
            ecc_uncorrected,
            xid_events: xids.to_vec(),
            problem: join_problems(problems),
            utilization_pct,
            memory_used_mb,
        })
    }
}

/// Registers one event set per GPU for critical XIDs. A GPU that cannot (old GPU, vGPU, missing permission) is logged
/// once here and polled without XIDs; temperature and ECC still cover it.
#[cfg(target_os = "linux")]
fn register_xid_events(nvml: &'static Nvml, count: u32) -> Vec<(u32, EventSet<'static>)> {
    use nvml_wrapper::bitmasks::event::EventTypes;

    let mut sets = Vec::new();
    for index in 0..count {
        let registered = nvml.device_by_index(index).map_err(|e| e.to_string()).and_then(|device| {
            let supported = device.supported_event_types().map_err(|e| e.to_string())?;
            if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
                return Err("the GPU does not support critical XID events".to_string());
            }
            let set = nvml.create_event_set().map_err(|e| e.to_string())?;
            device.register_events(EventTypes::CRITICAL_XID_ERROR, set).map_err(|e| e.to_string())
        });
        match registered {
            Ok(set) => sets.push((index, set)),
            Err(reason) => tracing::warn!(gpu = index, "XID events unavailable ({reason}); XIDs will not be detected"),
        }
    }
    sets
}

#[cfg(not(target_os = "linux"))]
fn register_xid_events(_nvml: &'static Nvml, _count: u32) -> Vec<(u32, EventSet<'static>)> {
    tracing::warn!("XID events are only available on Linux; XIDs will not be detected");
    Vec::new()
}

/// Takes every XID queued on the sets without waiting (a 0 ms timeout), grouped by GPU index.
fn drain_xids(sets: &[(u32, EventSet<'static>)]) -> BTreeMap<u32, Vec<u64>> {
    let mut seen: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (index, set) in sets {
        for _ in 0..MAX_XID_EVENTS_PER_POLL {
            match set.wait(0) {
                Ok(event) => match event.event_data {
                    Some(XidError::Value(xid)) => seen.entry(*index).or_default().push(xid),
                    Some(XidError::Unknown) | None => {
                        tracing::warn!(gpu = index, "critical XID event without a code");
                    }
                },
                // Timeout is NVML's "nothing queued": the normal end of the drain.
                Err(NvmlError::Timeout) => break,
                Err(err) => {
                    tracing::warn!(gpu = index, "waiting for XID events failed: {err}");
                    break;
                }
            }
        }
    }
    seen
}

impl GpuBackend for NvmlBackend {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let count = self.nvml.device_count().map_err(nvml_error("nvmlDeviceGetCount"))?;
        (0..count).map(|index| self.gpu_info(index)).collect()
    }

    fn compute_processes(&self, index: u32) -> Result<Vec<u32>, GpuError> {
        let device = self.nvml.device_by_index(index).map_err(nvml_error("nvmlDeviceGetHandleByIndex"))?;
        let processes =
            device.running_compute_processes().map_err(nvml_error("nvmlDeviceGetComputeRunningProcesses"))?;
        Ok(processes.into_iter().map(|p| p.pid).collect())
    }

    fn set_clocks(&self, index: u32, freq: &GpuFreq) -> Result<Clocks, GpuError> {
        let mut device = self.nvml.device_by_index(index).map_err(nvml_error("nvmlDeviceGetHandleByIndex"))?;
        let memory = device.supported_memory_clocks().map_err(nvml_error("nvmlDeviceGetSupportedMemoryClocks"))?;
        let chosen = choose_clocks(freq, &memory, |mem| {
            device.supported_graphics_clocks(mem).map_err(nvml_error("nvmlDeviceGetSupportedGraphicsClocks"))
        })?;
        let clocks = chosen.ok_or_else(|| GpuError::Nvml {
            call: "nvmlDeviceGetSupportedMemoryClocks",
            message: format!("GPU {index} lists no clocks to choose from"),
        })?;
        device
            .set_applications_clocks(clocks.memory_mhz, clocks.graphics_mhz)
            .map_err(nvml_error("nvmlDeviceSetApplicationsClocks"))?;
        Ok(clocks)
    }

    fn reset_clocks(&self, index: u32) -> Result<(), GpuError> {
        let mut device = self.nvml.device_by_index(index).map_err(nvml_error("nvmlDeviceGetHandleByIndex"))?;
        device.reset_applications_clocks().map_err(nvml_error("nvmlDeviceResetApplicationsClocks"))
    }

    fn clocks(&self, index: u32) -> Result<Clocks, GpuError> {
        use nvml_wrapper::enum_wrappers::device::Clock;
        let device = self.nvml.device_by_index(index).map_err(nvml_error("nvmlDeviceGetHandleByIndex"))?;
        Ok(Clocks {
            memory_mhz: device
                .applications_clock(Clock::Memory)
                .map_err(nvml_error("nvmlDeviceGetApplicationsClock"))?,
            graphics_mhz: device
                .applications_clock(Clock::Graphics)
                .map_err(nvml_error("nvmlDeviceGetApplicationsClock"))?,
        })
    }

    fn health(&self) -> Result<Vec<GpuHealth>, GpuError> {
        let count = self.nvml.device_count().map_err(nvml_error("nvmlDeviceGetCount"))?;
        let poll = lock(&self.poll);
        let xids = drain_xids(&poll.xid_sets);
        let mut health = Vec::with_capacity(count as usize);
        for index in 0..count {
            let gpu_xids = xids.get(&index).map(Vec::as_slice).unwrap_or_default();
            health.push(self.gpu_health(index, gpu_xids)?);
        }
        Ok(health)
    }
}

/// A fault to inject into a simulated GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimulatedFault {
    /// Adds this many uncorrectable ECC errors (counters only grow, as on real hardware).
    UncorrectableEcc(u64),
    /// Raises this XID; it shows in the next poll's `xid_events`.
    Xid(u64),
    /// Sets the temperature.
    Temperature(u32),
    /// Sets the utilization, in percent (what a training step's load would read); not a fault, but drills and
    /// the metrics tests need a GPU that looks busy.
    Utilization(u32),
    /// Back to a healthy GPU: the operator "replaced" it.
    Clear,
}

/// A node's GPUs without NVML: simulated nodes for tests, drills and development, and the configured inventory a node
/// advertises when the driver is missing. Faults are injected through [`SimulatedBackend::inject`] or a fault file.
pub struct SimulatedBackend {
    gpus: Vec<GpuInfo>,
    description: String,
    /// The simulated node's mark on its tasks (`None`: a configured inventory of real GPUs the agent cannot see).
    /// A simulated GPU is held by every live process that was given it: one whose environment carries this mark
    /// ([`SIMULATED_NODE_VAR`]) and lists the GPU in `CUDA_VISIBLE_DEVICES`, as every task the agent starts does.
    /// So a task's leftovers (a double fork, a process outside its group) hold the GPU until they are gone, as a
    /// CUDA context holds a real one. The node name alone is not enough: concurrent test clusters on one host all
    /// have a `node01`, and one's running job must not hold another's GPU 0.
    simulated_node: Option<String>,
    /// What a cleared GPU reads: a plausible idle value when simulated, nothing when the inventory is only configured
    /// (inventing a temperature for a real GPU we cannot see would mislead).
    idle_temperature_c: Option<u32>,
    fault_file: Option<PathBuf>,
    state: Mutex<SimulatedState>,
}

struct SimulatedState {
    gpus: Vec<SimulatedGpu>,
    /// The fault file's text as last applied, so that each poll applies only what the operator added since.
    fault_file_applied: String,
}

#[derive(Clone, Default)]
struct SimulatedGpu {
    temperature_c: Option<u32>,
    ecc_uncorrected: u64,
    pending_xids: Vec<u64>,
    utilization_pct: u32,
    /// Application clocks set for a job; `None` at the defaults.
    clocks: Option<Clocks>,
}

/// A simulated GPU's memory clocks (MHz): an H100 or H200 lists one or two; three make `--gpu-freq=memory=...` show.
const SIMULATED_MEMORY_CLOCKS: [u32; 3] = [2619, 1593, 810];
/// Its graphics clocks: 1980 MHz down to 345 in steps of 15, as an H100 lists them.
fn simulated_graphics_clocks() -> Vec<u32> {
    (0..=109).map(|step| 1980 - 15 * step).collect()
}
/// Its default application clocks (what a reset sets).
const SIMULATED_DEFAULT_CLOCKS: Clocks = Clocks { memory_mhz: 2619, graphics_mhz: 1980 };

impl SimulatedBackend {
    /// `count` simulated GPUs of `model` (e.g. `H200`). `seed` is the node name, so two simulated nodes never share a
    /// GPU UUID; the same arguments always give the same inventory.
    pub fn new(count: u32, model: &str, seed: &str) -> SimulatedBackend {
        let name = if model.starts_with("NVIDIA") { model.to_string() } else { format!("NVIDIA {model}") };
        let gpus = (0..count)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-sim-{seed}-{index}"),
                name: format!("{name} (simulated)"),
                memory_mb: model_memory_mb(model).unwrap_or(DEFAULT_SIMULATED_MEMORY_MB),
                pci_bus_id: pci_bus_id(index),
            })
            .collect();
        let mut backend = Self::build(gpus, format!("simulated ({count} GPUs)"), Some(SIMULATED_IDLE_TEMPERATURE_C));
        backend.simulated_node = Some(seed.to_string());
        backend
    }

    /// Marks this node's tasks with `marker` instead of the node name: something unique to this node on its host
    /// and stable across agent restarts (the agent uses its name and state directory), so that a restarted agent
    /// still sees its earlier tasks as holders and no other simulated node's tasks ever are.
    pub fn with_host_marker(mut self, marker: &str) -> SimulatedBackend {
        if self.simulated_node.is_some() {
            self.simulated_node = Some(marker.to_string());
        }
        self
    }

    /// The inventory the config promises, for a node whose NVML cannot be opened.
    fn configured(expected: &ExpectedGpus, seed: &str) -> SimulatedBackend {
        let count = expected.count.unwrap_or(0);
        let (name, memory_mb) = match expected.model_contains.as_deref() {
            Some(model) if model.starts_with("NVIDIA") => (model.to_string(), model_memory_mb(model)),
            Some(model) => (format!("NVIDIA {model}"), model_memory_mb(model)),
            None => ("unknown GPU".to_string(), None),
        };
        let gpus = (0..count)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-cfg-{seed}-{index}"),
                name: format!("{name} (configured)"),
                // Unknown rather than invented: the scheduler must not trust a made-up memory size.
                memory_mb: memory_mb.unwrap_or(0),
                pci_bus_id: pci_bus_id(index),
            })
            .collect();
        Self::build(gpus, format!("configured inventory (no NVML): {count} x {name}"), None)
    }

    fn build(gpus: Vec<GpuInfo>, description: String, idle_temperature_c: Option<u32>) -> SimulatedBackend {
        let healthy = SimulatedGpu { temperature_c: idle_temperature_c, ..SimulatedGpu::default() };
        let state = SimulatedState { gpus: vec![healthy; gpus.len()], fault_file_applied: String::new() };
        SimulatedBackend {
            gpus,
            description,
            simulated_node: None,
            idle_temperature_c,
            fault_file: None,
            state: Mutex::new(state),
        }
    }

    /// Reads faults from `path` on every health poll, so an operator can break a GPU of a running simulated agent:
    /// one fault a line, `<index> xid <code>`, `<index> ecc <count>`, `<index> temp <celsius>` or `<index> clear`
    /// (`#` starts a comment). Appended lines are applied once; a rewritten file is applied whole.
    pub fn with_fault_file(mut self, path: impl Into<PathBuf>) -> SimulatedBackend {
        self.fault_file = Some(path.into());
        self
    }

    /// Injects a fault into GPU `index`; it shows in the next [`GpuBackend::health`] poll.
    pub fn inject(&self, index: u32, fault: SimulatedFault) {
        let mut state = lock(&self.state);
        self.apply(&mut state, index, fault);
    }

    fn model_name(&self) -> &str {
        self.gpus.first().map_or("no GPUs", |g| g.name.as_str())
    }

    fn apply(&self, state: &mut SimulatedState, index: u32, fault: SimulatedFault) {
        let Some(gpu) = state.gpus.get_mut(index as usize) else {
            tracing::warn!("fault {fault:?} for GPU {index} ignored: this node has {} GPUs", self.gpus.len());
            return;
        };
        match fault {
            SimulatedFault::UncorrectableEcc(n) => gpu.ecc_uncorrected = gpu.ecc_uncorrected.saturating_add(n),
            SimulatedFault::Xid(code) => gpu.pending_xids.push(code),
            SimulatedFault::Temperature(t) => gpu.temperature_c = Some(t),
            SimulatedFault::Utilization(pct) => gpu.utilization_pct = pct,
            SimulatedFault::Clear => {
                *gpu = SimulatedGpu { temperature_c: self.idle_temperature_c, ..SimulatedGpu::default() };
            }
        }
    }

    fn apply_fault_file(&self, state: &mut SimulatedState) {
        let Some(path) = &self.fault_file else { return };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            // No file is the normal state: no drill running. Forget what was applied, so a new file applies whole.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                state.fault_file_applied.clear();
                return;
            }
            Err(err) => {
                tracing::warn!("cannot read GPU fault file {}: {err}", path.display());
                return;
            }
        };
        if text == state.fault_file_applied {
            return;
        }
        let applied = &state.fault_file_applied;
        // Only whole lines count as already applied; a line still being written is taken again once complete.
        let new = if !applied.is_empty() && applied.ends_with('\n') && text.starts_with(applied.as_str()) {
            &text[applied.len()..]
        } else {
            text.as_str()
        };
        for line in new.lines() {
            match parse_fault_line(line) {
                Ok(Some((index, fault))) => self.apply(state, index, fault),
                Ok(None) => {}
                Err(err) => tracing::warn!("GPU fault file {}: {err}; line skipped", path.display()),
            }
        }
        state.fault_file_applied = text;
    }
}

/// The live processes holding simulated GPU `index` of the node that marks its tasks `marker` (see
/// [`SimulatedBackend`]'s `simulated_node`).
/// Processes whose environment cannot be read (another user's, without root) are not seen: the agent runs as root.
fn simulated_holders(marker: &str, index: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let index = index.to_string();
    let mark = format!("{SIMULATED_NODE_VAR}=");
    let mut holders = Vec::new();
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let mut on_node = false;
        let (mut visible, mut in_container) = (None, None);
        for var in environ.split(|b| *b == 0) {
            if let Some(value) = var.strip_prefix(mark.as_bytes()) {
                on_node = value == marker.as_bytes();
            } else if let Some(value) = var.strip_prefix(b"CUDA_VISIBLE_DEVICES=") {
                visible = Some(value);
            } else if let Some(value) = var.strip_prefix(crate::container::NODE_GPUS_VAR.as_bytes()) {
                in_container = value.strip_prefix(b"=");
            }
        }
        // Inside a container CUDA numbers the job's GPUs from 0; the node's own indices are kept beside them.
        let listed = in_container.or(visible).unwrap_or_default();
        let has_gpu = listed.split(|b| *b == b',').any(|v| v == index.as_bytes());
        // A zombie has no environment left (the read is empty): it holds nothing.
        if on_node && has_gpu {
            holders.push(pid);
        }
    }
    holders
}

/// Memory of the models we simulate, as `nvidia-smi` reports it.
fn model_memory_mb(model: &str) -> Option<u64> {
    let model = model.to_lowercase();
    [("h200", 143_771), ("h100", 81_559), ("a100", 81_920)]
        .into_iter()
        .find_map(|(key, mb)| model.contains(key).then_some(mb))
}

/// Where H100/H200 boards typically sit on an HGX baseboard; only has to look real and be unique per index.
fn pci_bus_id(index: u32) -> String {
    format!("00000000:{:02X}:00.0", index + 0x18)
}

/// A fault-file line that cannot be understood (the line is skipped, with this in the agent's log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed line {line:?}: {problem}")]
pub struct MalformedFaultLine {
    pub line: String,
    pub problem: FaultLineProblem,
}

/// What is wrong with a fault-file line; each says what the line should look like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultLineProblem {
    #[error("the first word must be a GPU index")]
    NoIndex,
    #[error("{what} must be a non-negative integer")]
    NotANumber { what: &'static str },
    #[error("expected `<index> {kind} <{what}>`")]
    NoValue { kind: String, what: &'static str },
    #[error("temperature out of range")]
    TemperatureOutOfRange,
    #[error("utilization is 0 to 100")]
    UtilizationOutOfRange,
    #[error("`clear` takes no value")]
    ClearWithValue,
    #[error("expected `xid`, `ecc`, `temp`, `util` or `clear` after the index")]
    UnknownKind,
}

/// One fault-file line: `Ok(None)` for blank lines and comments, `Err` naming the line when it cannot be understood.
fn parse_fault_line(line: &str) -> Result<Option<(u32, SimulatedFault)>, MalformedFaultLine> {
    let content = line.split('#').next().unwrap_or_default().trim();
    if content.is_empty() {
        return Ok(None);
    }
    let malformed = |problem: FaultLineProblem| MalformedFaultLine { line: line.to_string(), problem };
    let words: Vec<&str> = content.split_whitespace().collect();
    let index: u32 = words[0].parse().map_err(|_| malformed(FaultLineProblem::NoIndex))?;
    let value = |what: &'static str| -> Result<u64, MalformedFaultLine> {
        match words.as_slice() {
            [_, _, v] => v.parse().map_err(|_| malformed(FaultLineProblem::NotANumber { what })),
            _ => Err(malformed(FaultLineProblem::NoValue { kind: words[1].to_string(), what })),
        }
    };
    let fault = match words.get(1).map(|w| w.to_lowercase()).as_deref() {
        Some("xid") => SimulatedFault::Xid(value("code")?),
        Some("ecc") => SimulatedFault::UncorrectableEcc(value("count")?),
        Some("temp") => {
            let t = value("celsius")?;
            SimulatedFault::Temperature(
                u32::try_from(t).map_err(|_| malformed(FaultLineProblem::TemperatureOutOfRange))?,
            )
        }
        Some("util") => {
            let pct = value("percent")?;
            SimulatedFault::Utilization(
                u32::try_from(pct)
                    .ok()
                    .filter(|p| *p <= 100)
                    .ok_or_else(|| malformed(FaultLineProblem::UtilizationOutOfRange))?,
            )
        }
        Some("clear") if words.len() == 2 => SimulatedFault::Clear,
        Some("clear") => return Err(malformed(FaultLineProblem::ClearWithValue)),
        _ => return Err(malformed(FaultLineProblem::UnknownKind)),
    };
    Ok(Some((index, fault)))
}

impl GpuBackend for SimulatedBackend {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn compute_processes(&self, index: u32) -> Result<Vec<u32>, GpuError> {
        let Some(node) = &self.simulated_node else {
            return Err(GpuError::NoDriver("a configured inventory cannot see the GPUs' processes".into()));
        };
        Ok(simulated_holders(node, index))
    }

    fn task_environment(&self) -> Vec<(String, String)> {
        self.simulated_node.iter().map(|marker| (SIMULATED_NODE_VAR.to_string(), marker.clone())).collect()
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(self.gpus.clone())
    }

    fn set_clocks(&self, index: u32, freq: &GpuFreq) -> Result<Clocks, GpuError> {
        self.can_clock()?;
        let clocks = choose_clocks(freq, &SIMULATED_MEMORY_CLOCKS, |_| Ok(simulated_graphics_clocks()))?
            .expect("a simulated GPU lists clocks");
        self.simulated_gpu(index, |gpu| gpu.clocks = Some(clocks))?;
        Ok(clocks)
    }

    fn reset_clocks(&self, index: u32) -> Result<(), GpuError> {
        self.can_clock()?;
        self.simulated_gpu(index, |gpu| gpu.clocks = None)
    }

    fn clocks(&self, index: u32) -> Result<Clocks, GpuError> {
        self.can_clock()?;
        let mut clocks = SIMULATED_DEFAULT_CLOCKS;
        self.simulated_gpu(index, |gpu| clocks = gpu.clocks.unwrap_or(SIMULATED_DEFAULT_CLOCKS))?;
        Ok(clocks)
    }

    fn health(&self) -> Result<Vec<GpuHealth>, GpuError> {
        let mut state = lock(&self.state);
        self.apply_fault_file(&mut state);
        let health = state
            .gpus
            .iter_mut()
            .zip(0u32..)
            .map(|(gpu, index)| {
                let xid_events = std::mem::take(&mut gpu.pending_xids);
                let problems = assess(gpu.temperature_c, gpu.ecc_uncorrected);
                GpuHealth {
                    index,
                    temperature_c: gpu.temperature_c,
                    ecc_corrected: 0,
                    ecc_uncorrected: gpu.ecc_uncorrected,
                    xid_events,
                    problem: join_problems(problems),
                    // A configured inventory without NVML reads nothing; a simulated GPU reads what was set.
                    utilization_pct: self.idle_temperature_c.map(|_| gpu.utilization_pct),
                    memory_used_mb: self.idle_temperature_c.map(|_| 0),
                }
            })
            .collect();
        Ok(health)
    }
}

impl SimulatedBackend {
    /// A configured inventory stands for real GPUs the agent cannot reach: it must not pretend to set their clocks.
    fn can_clock(&self) -> Result<(), GpuError> {
        match self.simulated_node {
            Some(_) => Ok(()),
            None => Err(GpuError::NoDriver("a configured inventory cannot set the GPUs' clocks".into())),
        }
    }

    fn simulated_gpu(&self, index: u32, change: impl FnOnce(&mut SimulatedGpu)) -> Result<(), GpuError> {
        let mut state = lock(&self.state);
        let gpu = state.gpus.get_mut(index as usize).ok_or_else(|| GpuError::Nvml {
            call: "nvmlDeviceGetHandleByIndex",
            message: format!("no simulated GPU {index}"),
        })?;
        change(gpu);
        Ok(())
    }
}

/// "0-3,5,7-8" (or "none"): compact, and makes a hole in the sequence jump out.
fn index_ranges_or_none(sorted: &[u32]) -> String {
    if sorted.is_empty() { "none".to_string() } else { drover_common::ranges::format_ranges(sorted) }
}

#[cfg(test)]
mod tests {
    /// A simulated GPU is held by every live process that was given it on this node, and by nothing else.
    #[test]
    fn a_simulated_gpu_is_held_by_every_live_process_given_it() {
        let node = format!("gpu-holders-{}", std::process::id());
        let backend = SimulatedBackend::new(4, "H200", "node01").with_host_marker(&node);
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .envs(backend.task_environment())
            .env("SLURMD_NODENAME", "node01")
            .env("CUDA_VISIBLE_DEVICES", "1,3")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Between fork and exec the child still has this test's environment: wait for the exec.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while backend.compute_processes(1).unwrap().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(backend.compute_processes(1).unwrap(), [pid]);
        assert_eq!(backend.compute_processes(3).unwrap(), [pid]);
        assert!(backend.compute_processes(0).unwrap().is_empty());
        let other = SimulatedBackend::new(4, "H200", "node01").with_host_marker(&format!("{node}-other"));
        assert!(other.compute_processes(1).unwrap().is_empty(), "another cluster's node01 GPU 1");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(backend.compute_processes(1).unwrap().is_empty(), "gone with its holder");
        let configured = SimulatedBackend::configured(&ExpectedGpus { count: Some(2), ..ExpectedGpus::default() }, "n");
        assert!(configured.compute_processes(0).is_err(), "a configured inventory cannot see processes");
    }

    use super::*;

    /// `--gpu-freq` on a simulated GPU: levels resolve against its clock lists, one GPU at a time, and a reset
    /// brings the defaults back. A configured inventory stands for real GPUs the agent cannot reach: it refuses.
    #[test]
    fn simulated_clocks_follow_gpu_freq_and_a_configured_inventory_refuses() {
        let backend = SimulatedBackend::new(2, "H100", "n1");
        let defaults = backend.clocks(0).unwrap();
        assert_eq!(defaults, Clocks { memory_mhz: 2619, graphics_mhz: 1980 });
        let freq = GpuFreq::parse("1500,memory=low").unwrap();
        assert_eq!(backend.set_clocks(1, &freq).unwrap(), Clocks { memory_mhz: 810, graphics_mhz: 1500 });
        assert_eq!(backend.clocks(1).unwrap().graphics_mhz, 1500);
        assert_eq!(backend.clocks(0).unwrap(), defaults);
        let highm1 = backend.set_clocks(0, &GpuFreq::parse("highm1").unwrap()).unwrap();
        assert_eq!(highm1, Clocks { memory_mhz: 2619, graphics_mhz: 1965 }, "memory at its highest unless asked");
        backend.reset_clocks(1).unwrap();
        assert_eq!(backend.clocks(1).unwrap(), defaults);
        assert!(backend.set_clocks(9, &freq).is_err(), "no GPU 9");

        let configured = SimulatedBackend::configured(&ExpectedGpus { count: Some(2), model_contains: None }, "n1");
        let err = configured.set_clocks(0, &freq).unwrap_err().to_string();
        assert!(err.contains("cannot set the GPUs' clocks"), "{err}");
    }

    fn gpu(index: u32, name: &str) -> GpuInfo {
        GpuInfo { index, name: name.to_string(), ..GpuInfo::default() }
    }

    fn expect(count: Option<u32>, model: Option<&str>) -> ExpectedGpus {
        ExpectedGpus { count, model_contains: model.map(str::to_string) }
    }

    fn mismatch(result: Result<(), GpuError>) -> String {
        match result {
            Err(GpuError::InventoryMismatch(msg)) => msg,
            other => panic!("expected an inventory mismatch, got {other:?}"),
        }
    }

    #[test]
    fn simulated_inventory_is_deterministic_and_distinct_per_node() {
        let a = SimulatedBackend::new(8, "H200", "gpu-a01").inventory().unwrap();
        let again = SimulatedBackend::new(8, "H200", "gpu-a01").inventory().unwrap();
        let b = SimulatedBackend::new(8, "H200", "gpu-a02").inventory().unwrap();

        assert_eq!(a, again, "the same node simulates the same GPUs after a restart");
        assert_eq!(a.len(), 8);
        assert_eq!(a[3].index, 3);
        assert_eq!(a[3].uuid, "GPU-sim-gpu-a01-3");
        assert_eq!(a[3].name, "NVIDIA H200 (simulated)");
        assert_eq!(a[3].memory_mb, 143_771);
        assert_eq!(a[0].pci_bus_id, "00000000:18:00.0");
        assert_eq!(a[7].pci_bus_id, "00000000:1F:00.0");
        assert!(a.iter().all(|g| !b.iter().any(|o| o.uuid == g.uuid)), "two nodes never share a GPU UUID");
        assert_eq!(SimulatedBackend::new(8, "H200", "n").describe(), "simulated (8 GPUs)");
    }

    #[test]
    fn simulated_gpus_are_healthy_until_a_fault_is_injected() {
        let node = SimulatedBackend::new(4, "H200", "n1");
        let health = node.health().unwrap();

        assert_eq!(health.len(), 4);
        assert!(health.iter().all(|h| h.temperature_c == Some(SIMULATED_IDLE_TEMPERATURE_C) && h.problem.is_none()));
        assert!(unhealthy(&health).is_empty());
    }

    #[test]
    fn injected_faults_show_up_in_health_and_unhealthy() {
        let node = SimulatedBackend::new(4, "H200", "n1");
        node.inject(1, SimulatedFault::UncorrectableEcc(3));
        node.inject(2, SimulatedFault::Temperature(95));
        node.inject(3, SimulatedFault::Xid(79));

        let health = node.health().unwrap();
        assert_eq!(health[1].ecc_uncorrected, 3);
        assert_eq!(health[3].xid_events, vec![79]);
        assert_eq!(
            unhealthy(&health),
            vec![(1, "uncorrectable ECC errors: 3".to_string()), (2, "temperature 95 C above limit 90 C".to_string())],
            "an XID is an event for the agent's XID table, not a standing problem"
        );
        assert_eq!(node.health().unwrap()[3].xid_events, Vec::<u64>::new(), "reported in one poll only");
    }

    #[test]
    fn a_gpu_at_exactly_the_temperature_limit_stays_in_service() {
        let node = SimulatedBackend::new(1, "H200", "n1");
        node.inject(0, SimulatedFault::Temperature(MAX_TEMPERATURE_C));
        assert!(unhealthy(&node.health().unwrap()).is_empty());
    }

    #[test]
    fn clearing_a_simulated_gpu_brings_back_its_idle_readings() {
        let node = SimulatedBackend::new(2, "H200", "n1");
        node.inject(0, SimulatedFault::UncorrectableEcc(2));
        assert_eq!(unhealthy(&node.health().unwrap()).len(), 1);
        node.inject(0, SimulatedFault::Clear);
        let cleared = node.health().unwrap();
        assert!(unhealthy(&cleared).is_empty());
        assert_eq!(cleared[0].temperature_c, Some(SIMULATED_IDLE_TEMPERATURE_C));
    }

    #[test]
    fn a_non_fatal_xid_is_reported_but_not_a_problem() {
        let node = SimulatedBackend::new(1, "H200", "n1");
        node.inject(0, SimulatedFault::Xid(13));

        let health = node.health().unwrap();
        assert_eq!(health[0].xid_events, vec![13]);
        assert!(unhealthy(&health).is_empty());
    }

    #[test]
    fn several_problems_on_one_gpu_are_all_named() {
        let node = SimulatedBackend::new(1, "H200", "n1");
        node.inject(0, SimulatedFault::Temperature(97));
        node.inject(0, SimulatedFault::UncorrectableEcc(1));

        let problem = node.health().unwrap()[0].problem.clone().unwrap();
        assert_eq!(problem, "uncorrectable ECC errors: 1; temperature 97 C above limit 90 C");
    }

    #[test]
    fn a_fault_for_a_gpu_the_node_does_not_have_is_ignored() {
        let node = SimulatedBackend::new(2, "H200", "n1");
        node.inject(7, SimulatedFault::Xid(79));
        assert!(unhealthy(&node.health().unwrap()).is_empty());
    }

    #[test]
    fn fault_file_lines_parse_and_malformed_lines_are_rejected_naming_the_line() {
        assert_eq!(parse_fault_line("3 xid 79"), Ok(Some((3, SimulatedFault::Xid(79)))));
        assert_eq!(parse_fault_line("1 ecc 2"), Ok(Some((1, SimulatedFault::UncorrectableEcc(2)))));
        assert_eq!(parse_fault_line("  0 TEMP 97  # hot aisle"), Ok(Some((0, SimulatedFault::Temperature(97)))));
        assert_eq!(parse_fault_line("2 clear"), Ok(Some((2, SimulatedFault::Clear))));
        assert_eq!(parse_fault_line("1 util 87"), Ok(Some((1, SimulatedFault::Utilization(87)))));
        assert_eq!(parse_fault_line(""), Ok(None));
        assert_eq!(parse_fault_line("# drill 4"), Ok(None));

        for bad in
            ["x xid 79", "3 xid", "3 xid seventy", "3 melt 1", "3", "2 clear now", "0 temp 99999999999", "0 util 101"]
        {
            let err = parse_fault_line(bad).unwrap_err();
            assert_eq!(err.line, bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err:?} names the line {bad:?}");
        }
    }

    #[test]
    fn a_busy_simulated_gpu_reads_its_utilization_and_stays_healthy_while_a_configured_inventory_reads_none() {
        let node = SimulatedBackend::new(2, "H200", "n1");
        node.inject(1, SimulatedFault::Utilization(87));
        let health = node.health().unwrap();
        assert_eq!((health[0].utilization_pct, health[1].utilization_pct), (Some(0), Some(87)));
        assert!(unhealthy(&health).is_empty(), "load is not a fault");

        let expected = ExpectedGpus { count: Some(2), model_contains: Some("H200".into()) };
        let configured = SimulatedBackend::configured(&expected, "n2");
        assert!(configured.health().unwrap().iter().all(|h| h.utilization_pct.is_none() && h.memory_used_mb.is_none()));
    }

    #[test]
    fn fault_file_is_applied_on_the_next_poll_skipping_malformed_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        std::fs::write(&path, "3 xid 79\nthis is not a fault\n1 ecc 2\n0 temp 97\n").unwrap();
        let node = SimulatedBackend::new(4, "H200", "n1").with_fault_file(&path);

        let health = node.health().unwrap();
        assert_eq!(health[3].xid_events, vec![79]);
        assert_eq!(health[1].ecc_uncorrected, 2);
        assert_eq!(health[0].temperature_c, Some(97));
        // The XID is an event for the agent's XID table, not a standing problem of the GPU.
        assert_eq!(unhealthy(&health).iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 1]);

        // Unchanged file: nothing is applied twice.
        let again = node.health().unwrap();
        assert!(again[3].xid_events.is_empty());
        assert_eq!(again[1].ecc_uncorrected, 2);

        // An appended line is applied alone.
        std::fs::write(&path, "3 xid 79\nthis is not a fault\n1 ecc 2\n0 temp 97\n3 clear\n").unwrap();
        let after = node.health().unwrap();
        assert!(after[3].problem.is_none() && after[3].xid_events.is_empty());
        assert_eq!(after[1].ecc_uncorrected, 2, "earlier lines are not re-applied");
    }

    #[test]
    fn a_missing_fault_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let node = SimulatedBackend::new(2, "H200", "n1").with_fault_file(dir.path().join("none"));
        assert!(unhealthy(&node.health().unwrap()).is_empty());
    }

    #[test]
    fn check_inventory_accepts_a_matching_node() {
        let found = SimulatedBackend::new(8, "H200", "n1").inventory().unwrap();
        assert!(check_inventory(&found, &expect(Some(8), Some("h200"))).is_ok());
        assert!(check_inventory(&found, &expect(None, None)).is_ok(), "nothing configured, nothing to contradict");
    }

    #[test]
    fn check_inventory_names_the_missing_index_when_the_count_differs() {
        let seven: Vec<GpuInfo> = (0..7).map(|i| gpu(i, "NVIDIA H200")).collect();
        assert_eq!(
            mismatch(check_inventory(&seven, &expect(Some(8), None))),
            "config expects 8 GPUs but found 7 (indices 0-6; missing index 7?)"
        );

        let holes: Vec<GpuInfo> = [0, 1, 4, 5, 6, 7].into_iter().map(|i| gpu(i, "NVIDIA H200")).collect();
        assert_eq!(
            mismatch(check_inventory(&holes, &expect(Some(8), None))),
            "config expects 8 GPUs but found 6 (indices 0-1,4-7; missing indices 2, 3?)"
        );

        let nine: Vec<GpuInfo> = (0..9).map(|i| gpu(i, "NVIDIA H200")).collect();
        assert_eq!(
            mismatch(check_inventory(&nine, &expect(Some(8), None))),
            "config expects 8 GPUs but found 9 (indices 0-8; unexpected index 8?)"
        );

        assert_eq!(
            mismatch(check_inventory(&[], &expect(Some(8), None))),
            "config expects 8 GPUs but found 0 (indices none; missing indices 0, 1, 2, 3, 4, 5, 6, 7?)"
        );
    }

    #[test]
    fn check_inventory_names_the_gpu_with_the_wrong_model() {
        let mut found: Vec<GpuInfo> = (0..8).map(|i| gpu(i, "NVIDIA H200")).collect();
        found[3].name = "NVIDIA A100".to_string();
        assert_eq!(
            mismatch(check_inventory(&found, &expect(Some(8), Some("H200")))),
            "GPU 3 is \"NVIDIA A100\", config expects a model containing \"H200\""
        );
    }

    #[test]
    fn open_backend_with_simulate_uses_the_simulated_backend() {
        let backend = open_backend(Some(4), "sim-07", "sim-07", &expect(Some(8), Some("H100")));

        assert_eq!(backend.describe(), "simulated (4 GPUs)", "simulate wins over the configured count");
        let inventory = backend.inventory().unwrap();
        assert_eq!(inventory.len(), 4);
        assert_eq!(inventory[0].uuid, "GPU-sim-sim-07-0");
        assert_eq!(inventory[0].name, "NVIDIA H100 (simulated)");
        assert_eq!(inventory[0].memory_mb, 81_559);
    }

    /// This machine has no NVIDIA driver; on one that has, NVML is used and there is no fallback to check.
    fn driver_present() -> bool {
        match NvmlBackend::open() {
            Ok(backend) => {
                eprintln!("NVML present ({}); fallback not exercised", backend.describe());
                true
            }
            Err(_) => false,
        }
    }

    #[test]
    fn nvml_without_a_driver_is_a_no_driver_error() {
        match NvmlBackend::open() {
            Ok(backend) => eprintln!("NVML present ({}); nothing to check", backend.describe()),
            Err(GpuError::NoDriver(msg)) => {
                assert!(msg.contains("libnvidia-ml.so"), "{msg}");
                let shown = GpuError::NoDriver(msg).to_string();
                assert!(shown.starts_with("NVIDIA driver not found (libnvidia-ml.so"), "{shown}");
            }
            Err(other) => panic!("without a driver NVML must report NoDriver, got {other:?}"),
        }
    }

    #[test]
    fn open_backend_without_a_driver_serves_the_configured_inventory() {
        if driver_present() {
            return;
        }
        let expected = expect(Some(8), Some("H200"));
        let backend = open_backend(None, "gpu-b03", "gpu-b03", &expected);

        assert!(backend.describe().contains("configured inventory (no NVML)"), "{}", backend.describe());
        let inventory = backend.inventory().unwrap();
        assert_eq!(inventory.len(), 8);
        assert!(check_inventory(&inventory, &expected).is_ok(), "the fallback satisfies the config it came from");
        let health = backend.health().unwrap();
        assert!(health.iter().all(|h| h.temperature_c.is_none()), "no temperature is invented without NVML");
        assert!(unhealthy(&health).is_empty());
    }

    #[test]
    fn open_backend_without_a_driver_or_a_configured_count_has_zero_gpus() {
        if driver_present() {
            return;
        }
        let backend = open_backend(None, "gpu-b03", "gpu-b03", &ExpectedGpus::default());

        assert!(backend.describe().contains("configured inventory (no NVML)"));
        assert!(backend.inventory().unwrap().is_empty());
        assert!(backend.health().unwrap().is_empty());
    }
}
