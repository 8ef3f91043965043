#!/bin/sh
# AgentENV's systemctl: sandboxes have no systemd, so templates that start services with
# `systemctl start X` (as E2B's do) get this small supervisor instead. It reads units from
# /etc/systemd/system and /lib/systemd/system and runs ExecStart as the unit's User in its
# WorkingDirectory with its Environment under a supervisor of its own session, which
# restarts it as Restart= and RestartSec= say. The supervisor's pid is kept in
# /run/aenv-units/<unit>.pid, the output in /var/log/<unit>.log.
# Installed by the template builder (agentenv/images/buildscripts.py).

# Where units, pid files and logs live (a test points this at a temporary tree).
ROOT="${AENV_SYSTEMCTL_ROOT:-}"
UNIT_DIRS="$ROOT/etc/systemd/system $ROOT/lib/systemd/system $ROOT/usr/lib/systemd/system"
RUN_DIR="$ROOT/run/aenv-units"
LOG_DIR="$ROOT/var/log"

say() { echo "systemctl: $*" >&2; }

unit_name() {
    case "$1" in
        *.service | *.target | *.socket | *.timer) echo "$1" ;;
        *) echo "$1.service" ;;
    esac
}

unit_file() {
    for dir in $UNIT_DIRS; do
        [ -f "$dir/$1" ] && { echo "$dir/$1"; return 0; }
    done
    return 1
}

# The values of key $2 in the [Service] section of unit file $1, one a line, in order;
# drop-ins in <unit>.d/*.conf are read after the unit.
unit_values() {
    for file in "$1" "${1}.d"/*.conf; do
        [ -f "$file" ] || continue
        section=
        while IFS= read -r line || [ -n "$line" ]; do
            case "$line" in
                \[*\]) section="$line"; continue ;;
                "#"* | ";"* | "") continue ;;
            esac
            [ "$section" = "[Service]" ] || continue
            key="${line%%=*}"
            key="$(echo "$key" | sed 's/[[:space:]]*$//')"
            [ "$key" = "$2" ] || continue
            echo "${line#*=}" | sed 's/^[[:space:]]*//'
        done <"$file"
    done
}

# The last value of key $2 (systemd: a later assignment wins).
unit_value() { unit_values "$1" "$2" | tail -n 1; }

# An Exec line without systemd's prefixes (-, @, +, !, :) that only change how it runs.
exec_command() {
    cmd="$1"
    while :; do
        case "$cmd" in
            [-@+!:]*) cmd="${cmd#?}" ;;
            *) break ;;
        esac
    done
    echo "$cmd"
}

# Whether process $1 runs: /proc, not kill -0 (a user may ask about a unit that runs as
# root); a zombie (state Z after the command's name) has ended.
alive() {
    [ -n "$1" ] && [ -f "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)" != Z ]
}

pid_of() {
    pidfile="$RUN_DIR/$1.pid"
    [ -f "$pidfile" ] || return 1
    pid="$(cat "$pidfile")"
    alive "$pid" || return 1
    echo "$pid"
}

# The shell commands that set the unit's environment: Environment= (quoted words) and
# EnvironmentFile= (a leading "-" means optional).
env_lines() {
    unit_values "$1" Environment | while IFS= read -r assignments; do
        echo "export $assignments"
    done
    unit_values "$1" EnvironmentFile | while IFS= read -r envfile; do
        optional=
        case "$envfile" in -*) optional=1; envfile="${envfile#-}" ;; esac
        if [ -f "$envfile" ]; then
            echo "set -a; . '$envfile'; set +a"
        elif [ -z "$optional" ]; then
            echo "echo 'systemctl: $envfile is missing' >&2; exit 1"
        fi
    done
}

# Run shell text $2 for unit file $1 as its User in its WorkingDirectory, and wait for it.
run_as_unit() {
    file="$1"
    user="$(unit_value "$file" User)"
    dir="$(unit_value "$file" WorkingDirectory)"
    case "$dir" in -*) dir="${dir#-}" ;; esac
    [ "$dir" = "~" ] && dir=
    script="$(env_lines "$file")
cd '${dir:-/}' 2>/dev/null || cd /
exec $2"
    if [ -n "$user" ] && [ "$user" != "root" ] && [ "$(id -u)" = "0" ]; then
        if [ -z "$dir" ]; then
            home="$(getent passwd "$user" 2>/dev/null | cut -d: -f6)"
            script="$(env_lines "$file")
cd '${home:-/}' 2>/dev/null || cd /
exec $2"
        fi
        set -- su -s /bin/sh "$user" -c "$script"
    else
        set -- /bin/sh -c "$script"
    fi
    "$@"
}

# The [Unit] section's values of key $2 in unit file $1, as words.
unit_deps() {
    section=
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            \[*\]) section="$line"; continue ;;
        esac
        [ "$section" = "[Unit]" ] || continue
        case "$line" in "$2"=*) echo "${line#*=}" ;; esac
    done <"$1"
}

# Whether Restart= policy $1 restarts a service that ended with status $2. As systemd:
# exit 0 and SIGHUP, SIGINT, SIGTERM or SIGPIPE are clean ends.
restarts() {
    case "$2" in 0 | 129 | 130 | 141 | 143) clean=1 ;; *) clean= ;; esac
    case "$1" in
        always) return 0 ;;
        on-success) [ -n "$clean" ] ;;
        on-failure) [ -z "$clean" ] ;;
        on-abnormal | on-abort | on-watchdog) [ -z "$clean" ] && [ "$2" -gt 128 ] ;;
        *) return 1 ;;
    esac
}

# RestartSec= in seconds (systemd's default is 100 ms; "500ms", "2s", "1min" all read).
restart_delay() {
    value="$(unit_value "$1" RestartSec)"
    echo "${value:-100ms}" | awk '{
        n = $0 + 0
        if ($0 ~ /ms$/) n = n / 1000
        else if ($0 ~ /min$/) n = n * 60
        print n
    }'
}

# ExecStartPre lines in order; a failing one without "-" fails the start.
run_pre() {
    unit_values "$1" ExecStartPre | while IFS= read -r pre; do
        optional=
        case "$pre" in -*) optional=1 ;; esac
        if ! run_as_unit "$1" "$(exec_command "$pre")" >>"$LOG" 2>&1; then
            [ -n "$optional" ] || { echo "ExecStartPre failed: $pre" >>"$LOG"; exit 1; }
        fi
    done
}

# ExecStartPost lines, once the service runs; failures are logged ("-" or not).
run_post() {
    unit_values "$1" ExecStartPost | while IFS= read -r post; do
        run_as_unit "$1" "$(exec_command "$post")" >>"$LOG" 2>&1 ||
            echo "ExecStartPost failed: $post" >>"$LOG"
    done
}

# The supervisor, in a session of its own: runs unit $1's ExecStart (after its
# ExecStartPre lines, unless $2 is "started": the caller ran them) until Restart= says no.
supervise_unit() {
    name="$1"
    file="$(unit_file "$name")" || exit 5
    LOG="$LOG_DIR/${name%.service}.log"
    policy="$(unit_value "$file" Restart)"
    delay="$(restart_delay "$file")"
    start="$(exec_command "$(unit_value "$file" ExecStart)")"
    phase="$2"
    while :; do
        if [ "$phase" = later ]; then
            sleep "$delay"
            phase=
        fi
        if [ "$phase" = started ] || run_pre "$file"; then
            run_as_unit "$file" "$start" >>"$LOG" 2>&1
            status=$?
        else
            status=1
        fi
        phase=
        restarts "$policy" "$status" || exit "$status"
        echo "systemctl: $name ended with status $status; restarting in ${delay}s" >>"$LOG"
        sleep "$delay"
    done
}

# Start the supervisor of unit $1 detached, in phase $2; its pid goes to the pid file.
spawn_supervisor() {
    if command -v setsid >/dev/null 2>&1; then
        setsid sh "$SELF" __supervise "$1" "$2" </dev/null >>"$LOG" 2>&1 &
    else
        sh "$SELF" __supervise "$1" "$2" </dev/null >>"$LOG" 2>&1 &
    fi
    echo $! >"$RUN_DIR/$1.pid"
}

start_unit() {
    name="$(unit_name "$1")"
    file="$(unit_file "$name")" || { say "Unit $name not found."; return 5; }
    pid_of "$name" >/dev/null && return 0
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    # A unit both requiring and wanted by another starts once, not in a loop.
    # (The marker holds this systemctl's pid: one left by a killed systemctl is stale.)
    starting="$RUN_DIR/$name.starting"
    [ -f "$starting" ] && alive "$(cat "$starting")" && return 0
    echo $$ >"$starting"
    start_units "$(unit_deps "$file" Requires)"
    LOG="$LOG_DIR/${name%.service}.log"
    start_service "$name" "$file"
    status=$?
    rm -f "$starting"
    [ $status -eq 0 ] || return $status
    start_units "$(unit_deps "$file" Wants)"
    return 0
}

start_service() {
    name="$1"
    file="$2"
    start="$(unit_value "$file" ExecStart)"
    [ -n "$start" ] || { say "$name has no ExecStart."; return 1; }
    if ! run_pre "$file"; then
        # systemd retries a failed start as Restart= says, and reports the failure now.
        restarts "$(unit_value "$file" Restart)" 1 && spawn_supervisor "$name" later
        say "Job for $name failed: ExecStartPre failed (see $LOG)."
        return 1
    fi
    if [ "$(unit_value "$file" Type)" = "oneshot" ]; then
        run_as_unit "$file" "$(exec_command "$start")" >>"$LOG" 2>&1
        return
    fi
    spawn_supervisor "$name" started
    run_post "$file"
    return 0
}

# Units named in words $1 start too; one failing is reported, not fatal.
start_units() {
    for dep in $1; do
        (start_unit "$dep") || say "$dep failed to start"
    done
}

stop_unit() {
    name="$(unit_name "$1")"
    if pid="$(pid_of "$name")"; then
        # The supervisor leads its own session: stop the whole group.
        kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
        tries=0
        while alive "$pid" && [ $tries -lt 50 ]; do
            sleep 0.1
            tries=$((tries + 1))
        done
        kill -KILL "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$RUN_DIR/$name.pid"
    for part in $(parts_of "$name"); do stop_unit "$part"; done
    return 0
}

# The running units whose PartOf= names unit $1: they stop (and restart) with it.
parts_of() {
    for pidfile in "$RUN_DIR"/*.pid; do
        [ -f "$pidfile" ] || continue
        unit="$(basename "$pidfile" .pid)"
        file="$(unit_file "$unit")" || continue
        for whole in $(unit_deps "$file" PartOf); do
            [ "$(unit_name "$whole")" = "$1" ] && echo "$unit"
        done
    done
}

status_unit() {
    name="$(unit_name "$1")"
    file="$(unit_file "$name")" || { echo "Unit $name could not be found."; return 4; }
    if pid="$(pid_of "$name")"; then
        echo "* $name - active (running), main pid $pid; log $LOG_DIR/${name%.service}.log"
        return 0
    fi
    echo "* $name - inactive (dead); unit $file"
    return 3
}

SELF="$0"
verb="$1"
[ $# -gt 0 ] && shift
if [ "$verb" = __supervise ]; then
    supervise_unit "$@"
    exit $?
fi
# Options systemd takes that change nothing here (--no-block, --quiet, --now, ...).
units=
now=
for arg in "$@"; do
    case "$arg" in
        --now) now=1 ;;
        -*) ;;
        *) units="$units $arg" ;;
    esac
done

status=0
case "$verb" in
    start)
        for unit in $units; do start_unit "$unit" || status=$?; done ;;
    stop)
        for unit in $units; do stop_unit "$unit" || status=$?; done ;;
    restart | reload-or-restart | try-restart)
        for unit in $units; do
            parts="$(parts_of "$(unit_name "$unit")")"
            stop_unit "$unit"
            start_unit "$unit" || status=$?
            for part in $parts; do start_unit "$part" || status=$?; done
        done ;;
    status)
        for unit in $units; do status_unit "$unit" || status=$?; done ;;
    is-active)
        for unit in $units; do
            if pid_of "$(unit_name "$unit")" >/dev/null; then echo active; else echo inactive; status=3; fi
        done ;;
    enable | disable | daemon-reload | reset-failed | mask | unmask | preset)
        # No boot to start units at: enabling records nothing; `--now` starts or stops.
        if [ -n "$now" ]; then
            for unit in $units; do
                if [ "$verb" = "enable" ]; then start_unit "$unit" || status=$?
                elif [ "$verb" = "disable" ]; then stop_unit "$unit"; fi
            done
        fi ;;
    is-enabled)
        echo enabled ;;
    is-system-running)
        echo running ;;
    "" | --version)
        echo "aenv systemctl (no systemd in sandboxes)" ;;
    *)
        say "'$verb' is not supported here (start, stop, restart, status, enable, disable, is-active, daemon-reload)"
        status=1 ;;
esac
exit $status
