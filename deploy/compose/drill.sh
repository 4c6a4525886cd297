#!/usr/bin/env bash
# End-to-end drill of a containerized Drover cluster: up, a real GPU job, a leader-kill chaos drill (drover-chaos
# against the containers), a leader kill (3) or the loss of a whole site (3site) watched from a client, down.
#
#   deploy/compose/drill.sh [3|3site]
#
# 3      3 controllers, 4 nodes (docker-compose.yml).
# 3site  5 controllers over sites a, b, c (2+2+1), 5 nodes (2+2+1) (docker-compose.3site.yml); kills every
#        container of the leader's site and shows the cluster keeps accepting and running jobs.
#
# Needs: root (drover-chaos submits as root from the host; iptables faults enter the containers' namespaces), docker,
# docker-compose (v1, or v2 as `docker compose`), the image (deploy/docker/make-base.sh && deploy/docker/build.sh),
# and drover + drover-chaos built on the host (cargo build --release -p drover-cli -p drover-chaos).
# Env: DROVER_IMAGE (drover:latest), STATE (/var/tmp/drover-compose/PROJECT), CARGO_TARGET_DIR (target/),
# DRILL (the chaos drill file; default chaos/drills/leader-kill.toml), SKIP_CHAOS=1, KEEP=1 (leave the cluster up),
# SITE=a|b|c (3site: the site to lose; default the leader's, or a when the leader is on c, the one-replica site).
# Everything it measured is printed at the end and kept in STATE/summary.txt.
set -euo pipefail

VARIANT=${1:-3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
IMAGE=${DROVER_IMAGE:-drover:latest}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
DRILL=${DRILL:-$ROOT/chaos/drills/leader-kill.toml}
case $VARIANT in
3) PROJECT=drover3; FILE=$HERE/docker-compose.yml; NODES=4; REPLICAS=3 ;;
3site) PROJECT=drover3site; FILE=$HERE/docker-compose.3site.yml; NODES=5; REPLICAS=5 ;;
*) echo "usage: $0 [3|3site]" >&2; exit 2 ;;
esac
STATE=${STATE:-/var/tmp/drover-compose/$PROJECT}

die() { echo "drill: FAILED: $*" >&2; exit 1; }
say() { printf '%(%H:%M:%S)T drill: %s\n' -1 "$*"; }
now_ms() { date +%s%3N; }
summary() { echo "$*" | tee -a "$STATE/summary.txt"; }

# --- what it needs, said plainly --------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || die "run as root: drover-chaos submits from the host as root and enters container namespaces"
command -v docker >/dev/null || die "docker is missing: install Docker Engine (apt-get install -y docker.io)"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer (is it running?)"
if command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
else die "docker-compose is missing (apt-get install -y docker-compose)"; fi
docker image inspect "$IMAGE" >/dev/null 2>&1 \
    || die "image $IMAGE is missing: run deploy/docker/make-base.sh && deploy/docker/build.sh"
find_bin() { # name: next to the build, else on PATH
    if [ -x "$TARGET_DIR/release/$1" ]; then echo "$TARGET_DIR/release/$1"; elif command -v "$1"; then :; else
        die "$1 is missing: cargo build --release -p ${2:-$1} (or set CARGO_TARGET_DIR)"; fi
}
DROVER=$(find_bin drover drover-cli)
if [ "${SKIP_CHAOS:-0}" != 1 ]; then CHAOS=$(find_bin drover-chaos); [ -f "$DRILL" ] || die "no drill file $DRILL"; fi

export COMPOSE_PROJECT_NAME=$PROJECT COMPOSE_FILE=$FILE DROVER_STATE=$STATE DROVER_IMAGE=$IMAGE
compose() { "${COMPOSE[@]}" "$@"; }

# A leftover of an earlier run (same project) goes first, volumes and all.
if [ -n "$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")" ] || [ -e "$STATE" ]; then
    say "removing an earlier $PROJECT (containers, volumes, $STATE)"
    [ -d "$STATE" ] || mkdir -p "$STATE"
    compose down -v --remove-orphans -t 2 >/dev/null 2>&1 || true
    rm -rf --one-file-system "$STATE"
fi

teardown() {
    local rc=$?
    if [ -d "$STATE" ]; then
        mkdir -p "$STATE/logs"
        for c in $(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT"); do
            name=$(docker inspect -f '{{.Name}}' "$c"); docker logs "$c" > "$STATE/logs/${name#/}.log" 2>&1 || true
        done
    fi
    if [ "${KEEP:-0}" = 1 ]; then
        say "KEEP=1: the cluster stays up (. $STATE/env; docker-compose down -v to remove it)"
    else
        say "tearing down $PROJECT"
        compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || echo "drill: docker-compose down failed; remove $PROJECT's containers by hand" >&2
    fi
    [ $rc -eq 0 ] && say "PASSED; container logs in $STATE/logs" || echo "drill: FAILED (exit $rc); container logs in $STATE/logs" >&2
}
trap teardown EXIT
trap 'exit 130' INT TERM

# --- configuration and keys --------------------------------------------------------------------------------------
mkdir -p "$STATE"; : > "$STATE/summary.txt"
ALLOW_ROOT_JOBS=true COMPOSE_PROJECT_NAME=$PROJECT "$HERE/setup.sh" "$VARIANT" "$STATE" >/dev/null
export DROVER_CONFIG=$STATE/shared/client.toml DROVER_AUTH_SOCKET=$STATE/run/login/auth.sock
host_drover() { "$DROVER" "$@"; }

ctr() { docker ps -a --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$1" --format '{{.Names}}'; }
login() { docker exec -u alice -w "$STATE/shared/alice" "$(ctr login)" "$@"; }

# --- up ------------------------------------------------------------------------------------------------------------
t_up=$(now_ms)
say "docker-compose up ($VARIANT: $REPLICAS controllers, $NODES nodes, a login node)"
compose up -d >/dev/null 2>"$STATE/up.err" || { cat "$STATE/up.err" >&2; die "docker-compose up failed"; }
wait_for() { # seconds what command...: retries every 200 ms
    local limit=$1 what=$2; shift 2
    local deadline=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${limit}s waiting for $what"
        sleep 0.2
    done
}
all_healthy() {
    local c s
    for c in $(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT"); do
        s=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$c")
        [ "$s" = healthy ] || return 1
    done
}
wait_for 120 "every container to be healthy (docker ps; logs in $STATE/logs)" all_healthy
t_healthy=$(now_ms)
leader_id() { host_drover cluster status 2>/dev/null | awk '$3 == "leader" { print $1; exit }'; }
ready() {
    local status
    status=$(host_drover cluster status 2>/dev/null) || return 1
    grep -q ' leader ' <<<"$status" && grep -q "nodes: $NODES\$" <<<"$status" || return 1
    [ "$(host_drover sinfo -h -t idle -o '%D' 2>/dev/null | awk '{ n += $1 } END { print n + 0 }')" -eq "$NODES" ]
}
wait_for 120 "a leader and $NODES idle nodes (drover cluster status; sinfo)" ready
t_ready=$(now_ms)
host_drover cluster status
host_drover sinfo
summary "up: containers healthy in $(( t_healthy - t_up )) ms, leader and all $NODES nodes idle in $(( t_ready - t_up )) ms"

# --- what operators watch: every controller's /healthz, /metrics and web page (http_listen, port 7180) -----------
metrics_ok() {
    local ip sessions=0
    for ip in $(host_drover cluster status 2>/dev/null | awk 'NR > 1 && $2 ~ /:7100$/ { sub(/:7100$/, "", $2); print $2 }'); do
        curl -sf --max-time 2 "http://$ip:7180/healthz" >/dev/null || return 1
        curl -sf --max-time 2 "http://$ip:7180/" | grep -q '<title>Drover</title>' || return 1
        m=$(curl -sf --max-time 2 "http://$ip:7180/metrics") || return 1
        grep -q '^drover_raft_is_leader 1' <<<"$m" && sessions=$(awk '$1 == "drover_agent_sessions" { print int($2) }' <<<"$m")
    done
    [ "$sessions" -eq "$NODES" ]
}
wait_for 30 "every controller's /healthz, web page and /metrics (the leader counting $NODES agent sessions)" metrics_ok
summary "metrics: every controller serves /healthz, / and /metrics on :7180; the leader counts $NODES agent sessions"

# --- a real job: 2 nodes x 1 task, 2 simulated GPUs each, submitted by alice on the login node ----------------------
wait_state() { # job want seconds: waits for a terminal state, fails unless it is `want`
    local job=$1 want=$2 limit=$3 state deadline=$(( $(date +%s) + $3 ))
    while :; do
        state=$(host_drover sacct -j "$job" -X -n -P -o State 2>/dev/null | head -1 | awk '{ print $1 }')
        case $state in
        "$want") return 0 ;;
        FAILED|CANCELLED*|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE)
            host_drover scontrol show job "$job" >&2 || true; die "job $job ended $state, not $want" ;;
        esac
        [ "$(date +%s)" -lt "$deadline" ] || { host_drover scontrol show job "$job" >&2 || true; die "job $job not $want within ${limit}s (last state: ${state:-none})"; }
        sleep 0.3
    done
}
say "sbatch as alice: -N 2 --gres=gpu:2, srun inside"
t0=$(now_ms)
# shellcheck disable=SC2016 # expanded by the job, not here
job=$(login sbatch --parsable -N 2 --ntasks-per-node=1 --gres=gpu:2 -t 5 -J hello-gpu \
    --wrap 'srun bash -c "echo \$(hostname) rank=\$SLURM_PROCID gpus=\$CUDA_VISIBLE_DEVICES master=\$MASTER_ADDR"') \
    || die "sbatch failed"
wait_state "$job" COMPLETED 120
t1=$(now_ms)
host_drover sacct -j "$job" -X -o JobID,JobName,User,State,ExitCode,NodeList,AllocTRES
echo "--- $STATE/shared/alice/slurm-$job.out:"; cat "$STATE/shared/alice/slurm-$job.out"
summary "job: $job (alice, 2 nodes x 2 GPUs, srun) COMPLETED in $(( t1 - t0 )) ms from sbatch; output: $(tr '\n' ';' < "$STATE/shared/alice/slurm-$job.out")"

# --- the leader-kill chaos drill, against the containers ---------------------------------------------------------
if [ "${SKIP_CHAOS:-0}" != 1 ]; then
    say "drover-chaos run $(basename "$DRILL") --docker-target (docker kill of the leader's container, docker start to heal)"
    "$CHAOS" run "$DRILL" --docker-target "$STATE/chaos-target.toml" --dir "$STATE/chaos" | tee "$STATE/chaos.out" \
        || die "the chaos drill failed or found a violation (report above; history in $STATE/chaos/results)"
    summary "chaos $(basename "$DRILL" .toml): $(grep -iE 'lost|failover' "$STATE/chaos.out" | tr -s ' ' | tr '\n' ';')"
    wait_for 60 "the cluster to be whole again after the chaos drill" ready
fi

# --- a fault watched from a client: what the users see ------------------------------------------------------------
jobs_known() { host_drover sacct -a -X -n -P -o JobID -S 2000-01-01 2>/dev/null | sort -n; }
# Work in flight when the fault hits: 4 one-GPU jobs of 15 s (best-fit packing usually puts them on one node),
# requeued elsewhere if their node goes.
say "4 jobs of 15 s in flight (alice), then the fault"
inflight=()
for _ in 1 2 3 4; do inflight+=("$(login sbatch --parsable --requeue --gres=gpu:1 -t 5 --wrap 'sleep 15; hostname')")
done
wait_for 30 "the in-flight jobs to run" bash -c "[ \$(DROVER_CONFIG=$DROVER_CONFIG DROVER_AUTH_SOCKET=$DROVER_AUTH_SOCKET $DROVER squeue -h -t R -o %i | wc -l) -ge 4 ]"
jobs_known > "$STATE/acked-before.txt"
old=$(leader_id); [ -n "$old" ] || die "no leader before the fault"
if [ "$VARIANT" = 3 ]; then
    victims=("$(ctr "ctl$old")")
    what="leader ctl$old killed (docker kill)"
else
    # The leader's site when it holds two replicas (the worst case: 2 of 5 replicas and the leader at once);
    # site a when the leader is on site c (one replica), so that two replicas still go. SITE=a|b|c chooses.
    lsite=$(docker inspect -f '{{index .Config.Labels "org.drover.site"}}' "$(ctr "ctl$old")")
    site=${SITE:-$lsite}; [ -n "${SITE:-}" ] || [ "$lsite" != c ] || site=a
    mapfile -t victims < <(docker ps --filter "label=com.docker.compose.project=$PROJECT" --filter "label=org.drover.site=$site" --format '{{.Names}}' | sort)
    [ "${#victims[@]}" -gt 0 ] || die "no running container on site $site"
    if [ "$site" = "$lsite" ]; then lead="the leader ctl$old among them"; else lead="the leader ctl$old (site $lsite) not among them"; fi
    what="site $site lost: ${victims[*]} killed at once (docker kill), $lead"
fi
say "$what"
t_kill=$(now_ms)
docker kill --signal KILL "${victims[@]}" >/dev/null
t_killed=$(now_ms)
# The first submission after the fault: sbatch follows the leader and retries within its deadline.
# shellcheck disable=SC2016 # expanded by the job, not here
after=$(login sbatch --parsable --gres=gpu:1 -t 5 -J after-fault --wrap 'echo ran on $(hostname)') || die "no submission accepted after the fault"
t_ack=$(now_ms)
new=""
# A leader again: a new one when the old one was killed, else the old one still leading.
gone=$old; [[ " ${victims[*]} " == *" $(ctr "ctl$old") "* ]] || gone=none
wait_for 30 "a leader" bash -c "id=\$(DROVER_CONFIG=$DROVER_CONFIG DROVER_AUTH_SOCKET=$DROVER_AUTH_SOCKET $DROVER cluster status 2>/dev/null | awk '\$3 == \"leader\" { print \$1; exit }'); [ -n \"\$id\" ] && [ \"\$id\" != $gone ]"
t_leader=$(now_ms)
new=$(leader_id)
wait_state "$after" COMPLETED 60
t_done=$(now_ms)
summary "fault: $what"
summary "  kill took $(( t_killed - t_kill )) ms; first submission acknowledged $(( t_ack - t_killed )) ms after it (job $after); leader ctl$new seen by $(( t_leader - t_killed )) ms; job $after COMPLETED at $(( t_done - t_killed )) ms (node, restarts: $(host_drover sacct -j "$after" -X -n -P -o NodeList,Restarts))"
for j in "${inflight[@]}"; do wait_state "$j" COMPLETED 90; done
summary "  in-flight jobs ${inflight[*]}: all COMPLETED; nodes, restarts: $(for j in "${inflight[@]}"; do host_drover sacct -j "$j" -X -n -P -o JobID,NodeList,Restarts; done | tr '\n' ' ')"
jobs_known > "$STATE/acked-after.txt"
lost=$(comm -23 "$STATE/acked-before.txt" "$STATE/acked-after.txt" | wc -l)
[ "$lost" -eq 0 ] || die "$lost acknowledged jobs are missing after the fault: $(comm -23 "$STATE/acked-before.txt" "$STATE/acked-after.txt" | tr '\n' ' ')"
summary "  acknowledged jobs before the fault: $(wc -l < "$STATE/acked-before.txt"), all still known after it (0 lost)"

# Back again: the victims rejoin and catch up.
t_back=$(now_ms)
docker start "${victims[@]}" >/dev/null
t_started=$(now_ms)
caught_up() {
    local s; s=$(host_drover cluster status 2>/dev/null) || return 1
    [ "$(awk 'NR > 1 && ($3 == "leader" || $3 == "follower") { n++ } END { print n + 0 }' <<<"$s")" -eq "$REPLICAS" ] || return 1
    # every replica within 10 entries of the leader's applied index
    awk 'NR > 1 && $3 ~ /leader|follower/ { a[$1] = $7; if ($3 == "leader") l = $7 } END { for (i in a) if (a[i] + 10 < l) exit 1 }' <<<"$s"
}
wait_for 90 "the killed containers to rejoin and catch up" caught_up
wait_for 60 "all $NODES nodes back" ready
summary "  restarted: docker start took $(( t_started - t_back )) ms; all $REPLICAS replicas leader/follower and caught up, all $NODES nodes idle $(( $(now_ms) - t_back )) ms after it began"
host_drover cluster status
echo; echo "=== summary ($STATE/summary.txt)"; cat "$STATE/summary.txt"
