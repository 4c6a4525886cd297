#!/usr/bin/env bash
# Makes everything a containerized Drover cluster needs before `docker-compose up`: a CA and cluster key
# (`drover certs init`), one certificate per controller, agent and client host (`drover certs issue`), and each
# container's configuration in the formats of deploy/config/ (the same ones `drover local up` writes).
#
#   deploy/compose/setup.sh 3|3site STATE_DIR
#
# 3:     docker-compose.yml: controllers ctl1-3, agents node01-04, a login node; one network 10.213.0.0/24.
# 3site: docker-compose.3site.yml: 5 controllers over sites a (ctl1, ctl2), b (ctl3, ctl4) and c (ctl5), agents
#        node01-02 (a), node03-04 (b), node05 (c), each with `site` in its topology; a network per site
#        (10.214.1-3.0/24) and the interconnect (10.214.0.0/24) that every Drover address is on.
#
# Layout of STATE_DIR (mounted read-only per container; see the compose files):
#   pki/                 the CA (ca.key stays here, never in a container), cluster key, every certificate
#   etc/SERVICE/         /etc/drover of that container: its TOML and only the keys it needs
#   shared/              the cluster's "shared file system" (job logs, checkpoints), same path everywhere;
#                        shared/client.toml and shared/pki: the client configuration drills and their jobs use
#   run/login/           the login node's /run/drover: its authd socket, for clients on the host
#   chaos-target.toml    how `drover-chaos run --docker-target` finds the containers
#   env                  DROVER_STATE, DROVER_IMAGE, COMPOSE_PROJECT_NAME, COMPOSE_FILE, DROVER_AUTH_SOCKET
#
# Env: DROVER_IMAGE (default drover:latest; the certificates are made by its drover binary), COMPOSE_PROJECT_NAME
# (default drover3 / drover3site), ALLOW_ROOT_JOBS (default false; a chaos drill run by root on the host submits as
# root and needs true), GPUS_PER_AGENT (default 8).
set -euo pipefail

VARIANT=${1:-}
STATE=${2:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IMAGE=${DROVER_IMAGE:-drover:latest}
ALLOW_ROOT_JOBS=${ALLOW_ROOT_JOBS:-false}
GPUS=${GPUS_PER_AGENT:-8}
CONTROLLER_UID=9100   # the image's drover user (deploy/docker/Dockerfile)

die() { echo "setup: $*" >&2; exit 1; }
case $VARIANT in
3) PROJECT=${COMPOSE_PROJECT_NAME:-drover3}; COMPOSE_FILE=$HERE/docker-compose.yml ;;
3site) PROJECT=${COMPOSE_PROJECT_NAME:-drover3site}; COMPOSE_FILE=$HERE/docker-compose.3site.yml ;;
*) die "usage: $0 3|3site STATE_DIR (the variant: 3 controllers on one network, or 5 over 3 sites)" ;;
esac
[ -n "$STATE" ] || die "usage: $0 $VARIANT STATE_DIR"
case $STATE in /*) ;; *) die "STATE_DIR must be absolute (containers mount parts of it at the same path): $STATE" ;; esac
case $ALLOW_ROOT_JOBS in true|false) ;; *) die "ALLOW_ROOT_JOBS must be true or false, not $ALLOW_ROOT_JOBS" ;; esac
{ [[ $GPUS =~ ^[0-9]+$ ]] && [ "$GPUS" -ge 1 ]; } || die "GPUS_PER_AGENT must be a positive number, not $GPUS"
command -v docker >/dev/null || die "docker is missing: install Docker Engine (apt-get install -y docker.io)"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer (is it running? are you allowed to use it?)"
docker image inspect "$IMAGE" >/dev/null 2>&1 \
    || die "image $IMAGE is missing: build it with deploy/docker/make-base.sh && deploy/docker/build.sh"
[ ! -e "$STATE/pki/ca.pem" ] || die "$STATE already holds a cluster's keys; remove it (or choose another directory) first"

# The topology: "service id-or-name wan-ip site site-ip". 3: one network, no sites.
if [ "$VARIANT" = 3 ]; then
    CONTROLLERS=("ctl1 1 10.213.0.11 - -" "ctl2 2 10.213.0.12 - -" "ctl3 3 10.213.0.13 - -")
    AGENTS=("node01 node01 10.213.0.101 - -" "node02 node02 10.213.0.102 - -"
            "node03 node03 10.213.0.103 - -" "node04 node04 10.213.0.104 - -")
    LOGIN_IP=10.213.0.200
else
    CONTROLLERS=("ctl1 1 10.214.0.11 a 10.214.1.11" "ctl2 2 10.214.0.12 a 10.214.1.12"
                 "ctl3 3 10.214.0.13 b 10.214.2.13" "ctl4 4 10.214.0.14 b 10.214.2.14"
                 "ctl5 5 10.214.0.15 c 10.214.3.15")
    AGENTS=("node01 node01 10.214.0.101 a 10.214.1.101" "node02 node02 10.214.0.102 a 10.214.1.102"
            "node03 node03 10.214.0.103 b 10.214.2.103" "node04 node04 10.214.0.104 b 10.214.2.104"
            "node05 node05 10.214.0.105 c 10.214.3.105")
    LOGIN_IP=10.214.0.200
fi

mkdir -p "$STATE"/{pki,etc,shared/jobs,shared/pki,run/login}
chmod 0755 "$STATE" "$STATE/etc"
chmod 1777 "$STATE/shared" "$STATE/shared/jobs"
# Home of each demo user's job files on the shared storage (the image's alice and bob: uids 1000 and 1001).
mkdir -p "$STATE/shared/alice" "$STATE/shared/bob"
chown 1000:1000 "$STATE/shared/alice"; chown 1001:1001 "$STATE/shared/bob"

# Every `drover certs` call, in one container of the image (no Drover binary is needed on the host).
certs="drover certs init --dir $STATE/pki --cluster-name $PROJECT >/dev/null"
members=""
controllers=""
for c in "${CONTROLLERS[@]}"; do
    read -r svc id ip site site_ip <<<"$c"
    ips=$ip; [ "$site_ip" = - ] || ips="$ip,$site_ip"
    certs+=" && drover certs issue --dir $STATE/pki --role controller:$id --ip $ips --dns $svc >/dev/null"
    members+="$id = \"$ip:7100\""$'\n'
    controllers+="${controllers:+, }\"$ip:7100\""
done
for a in "${AGENTS[@]}"; do
    read -r svc name ip site site_ip <<<"$a"
    ips="$ip,127.0.0.1"; [ "$site_ip" = - ] || ips="$ips,$site_ip"
    certs+=" && drover certs issue --dir $STATE/pki --role agent:$name --ip $ips --dns $svc >/dev/null"
    certs+=" && drover certs issue --dir $STATE/pki --role client:$name --dns $svc >/dev/null"
done
certs+=" && drover certs issue --dir $STATE/pki --role client:login --ip $LOGIN_IP --dns login >/dev/null"
certs+=" && drover certs issue --dir $STATE/pki --role client:drill >/dev/null"
docker run --rm -u 0 --entrypoint bash -v "$STATE:$STATE" "$IMAGE" -c "$certs" \
    || die "drover certs failed (see above)"

pki=$STATE/pki
security() { # cert-name
    printf '\n[security]\nkey_file = "/etc/drover/pki/cluster.key"\nca = "/etc/drover/pki/ca.pem"\ncert = "/etc/drover/pki/%s.pem"\nkey = "/etc/drover/pki/%s.key"\nreload_interval_ms = 5000\n' "$1" "$1"
}
client_toml() { # cert-name ca-dir
    printf '# The cluster as this host sees it. DROVER_CONTROLLERS or --controllers override the list.\ncontrollers = [%s]\nca = "%s/ca.pem"\ncert = "%s/%s.pem"\nkey = "%s/%s.key"\nauth_socket = "/run/drover/auth.sock"\n' \
        "$controllers" "$2" "$2" "$1" "$2" "$1"
}
give() { # dir files... : copy keys into a container's /etc/drover/pki
    local dir=$1; shift
    mkdir -p "$dir/pki"
    for f in "$@"; do cp -p "$pki/$f" "$dir/pki/$f"; done
}

for c in "${CONTROLLERS[@]}"; do
    read -r svc id ip site site_ip <<<"$c"
    dir=$STATE/etc/$svc
    give "$dir" ca.pem cluster.key "controller-$id.pem" "controller-$id.key"
    if [ "$site_ip" = - ]; then listen="listen = \"$ip:7100\""; else
        # Reachable on its site network and the interconnect; peers, agents and clients use the latter.
        listen="listen = \"0.0.0.0:7100\""$'\n'"advertise = \"$ip:7100\""
    fi
    cat > "$dir/controller.toml" <<TOML
# Replica $id of the $PROJECT cluster$([ "$site" = - ] || echo " (site $site)"); written by deploy/compose/setup.sh (see deploy/config/controller-1.toml).
id = $id
$listen
http_listen = "0.0.0.0:7180"          # /metrics, the web page and /healthz (the compose network only)
data_dir = "/var/lib/drover/controller"

[initial_members]
$members
[raft]
heartbeat_interval_ms = 50
election_timeout_min_ms = 200
election_timeout_max_ms = 300
snapshot_after_entries = 20000
keep_entries_after_snapshot = 2000

[cluster]
cluster_name = "$PROJECT"
# The chaos drill submits from the host as root; a real cluster keeps this false.
allow_root_jobs = $ALLOW_ROOT_JOBS

[agents]
heartbeat_ms = 500
fence_after_ms = 5000
node_timeout_ms = 8000
kill_wait_ms = 5000
$(security "controller-$id")
TOML
done

for a in "${AGENTS[@]}"; do
    read -r svc name ip site site_ip <<<"$a"
    dir=$STATE/etc/$svc
    give "$dir" ca.pem cluster.key "agent-$name.pem" "agent-$name.key" "client-$name.pem" "client-$name.key"
    topology=""
    [ "$site" = - ] || topology=$'\n'"[topology]"$'\n'"site = \"$site\""$'\n'
    cat > "$dir/agent.toml" <<TOML
# Node $name of the $PROJECT cluster$([ "$site" = - ] || echo " (site $site)"); written by deploy/compose/setup.sh (see deploy/config/agent.toml).
name = "$name"
controllers = [$controllers]
listen = "0.0.0.0:6818"
host = "$ip"                          # MASTER_ADDR when it is a job's first node
advertise = "$ip:6818"
metrics_listen = "0.0.0.0:9818"       # /metrics: GPU load and health
state_dir = "/var/lib/drover-agent/state"
cpus = 16                             # offered to jobs (simulated nodes; the machine has what it has)
memory_mb = 65536
kill_wait_ms = 5000
client_config = "/etc/drover/client.toml"
# Per-job memory cgroups need a writable cgroup file system, which an unprivileged container does not have:
# memory is scheduled, not enforced (the container's own limit applies). Nodes on hosts enforce it.
enforce_memory = false
$topology
[gpus]
simulate = $GPUS                      # no NVML in a container without a driver
model = "H200"
$(security "agent-$name")
TOML
    client_toml "client-$name" /etc/drover/pki > "$dir/client.toml"
done

give "$STATE/etc/login" ca.pem cluster.key client-login.pem client-login.key
client_toml client-login /etc/drover/pki > "$STATE/etc/login/client.toml"
# The login container runs drover-relayd (see drover-entrypoint): its sbatch submits through it.
echo 'relay_socket = "/run/drover/relay/relay.sock"' >> "$STATE/etc/login/client.toml"
# The drills' client configuration, at the same path on the host, on the login node and on every agent (jobs of a
# drill use it too); the socket is each host's own authd (the host's clients set DROVER_AUTH_SOCKET, see env).
cp -p "$pki/ca.pem" "$pki/client-drill.pem" "$pki/client-drill.key" "$STATE/shared/pki/"
chmod 0644 "$STATE/shared/pki/"*
client_toml client-drill "$STATE/shared/pki" > "$STATE/shared/client.toml"

# Ownership: controllers run as the image's drover user; agents and authd as root. Keys stay 0600.
chmod -R go-w "$STATE/etc"
for c in "${CONTROLLERS[@]}"; do
    read -r svc _ <<<"$c"
    chown -R "$CONTROLLER_UID:$CONTROLLER_UID" "$STATE/etc/$svc" 2>/dev/null \
        || docker run --rm -u 0 --entrypoint chown -v "$STATE:$STATE" "$IMAGE" -R "$CONTROLLER_UID:$CONTROLLER_UID" "$STATE/etc/$svc"
done

# drover-chaos's view of the containers (DockerTarget): who is who, and where.
{
    echo "# drover-chaos run DRILL --docker-target $STATE/chaos-target.toml"
    echo "project = \"$PROJECT\""
    echo "client_config = \"$STATE/shared/client.toml\""
    echo "shared_dir = \"$STATE/shared\""
    echo "auth_socket = \"$STATE/run/login/auth.sock\""
    for c in "${CONTROLLERS[@]}"; do
        read -r svc id ip site _ <<<"$c"
        printf '\n[[replica]]\nid = %s\nservice = "%s"\naddress = "%s:7100"\n' "$id" "$svc" "$ip"
        [ "$site" = - ] || printf 'site = "%s"\n' "$site"
    done
    for a in "${AGENTS[@]}"; do
        read -r svc name _ site _ <<<"$a"
        printf '\n[[agent]]\nname = "%s"\nservice = "%s"\n' "$name" "$svc"
        [ "$site" = - ] || printf 'site = "%s"\n' "$site"
    done
} > "$STATE/chaos-target.toml"

cat > "$STATE/env" <<ENV
export DROVER_STATE=$STATE
export DROVER_IMAGE=$IMAGE
export COMPOSE_PROJECT_NAME=$PROJECT
export COMPOSE_FILE=$COMPOSE_FILE
export DROVER_CONFIG=$STATE/shared/client.toml
export DROVER_AUTH_SOCKET=$STATE/run/login/auth.sock
ENV
echo "setup: $VARIANT cluster $PROJECT ready to start; configuration and keys in $STATE"
echo "  . $STATE/env && docker-compose up -d"
