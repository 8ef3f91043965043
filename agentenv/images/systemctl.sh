#!/bin/sh
# AgentENV's systemctl: sandboxes have no systemd, so templates that start services with
# `systemctl start X` (as E2B's do) get this small supervisor instead. It reads units from
# /etc/systemd/system and /lib/systemd/system, starts ExecStart detached as the unit's User
# in its WorkingDirectory with its Environment, keeps the pid in /run/aenv-units/<unit>.pid
# and the output in /var/log/<unit>.log. Restart= is not supervised.
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

pid_of() {
    pidfile="$RUN_DIR/$1.pid"
    [ -f "$pidfile" ] || return 1
    pid="$(cat "$pidfile")"
    # /proc, not kill -0: a user may ask about a unit that runs as root.
    [ -n "$pid" ] && [ -d "/proc/$pid" ] && { echo "$pid"; return 0; }
    return 1
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

# Run shell text $2 for unit file $1 as its User in its WorkingDirectory; $3 is "wait" to
# wait for it (ExecStartPre) or "detach" to leave it running and print its pid.
run_as_unit() {
    file="$1"
    mode="$3"
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
    if [ "$mode" = "wait" ]; then
        "$@"
        return
    fi
    if command -v setsid >/dev/null 2>&1; then
        setsid "$@" </dev/null >>"$LOG" 2>&1 &
    else
        "$@" </dev/null >>"$LOG" 2>&1 &
    fi
    echo $!
}

start_unit() {
    name="$(unit_name "$1")"
    file="$(unit_file "$name")" || { say "Unit $name not found."; return 5; }
    pid_of "$name" >/dev/null && return 0
    mkdir -p "$RUN_DIR" "$LOG_DIR"
    LOG="$LOG_DIR/${name%.service}.log"
    unit_values "$file" ExecStartPre | while IFS= read -r pre; do
        optional=
        case "$pre" in -*) optional=1 ;; esac
        if ! run_as_unit "$file" "$(exec_command "$pre")" wait >>"$LOG" 2>&1; then
            [ -n "$optional" ] || { echo "ExecStartPre failed: $pre" >>"$LOG"; exit 1; }
        fi
    done || { say "Job for $name failed: ExecStartPre failed (see $LOG)."; return 1; }
    start="$(unit_value "$file" ExecStart)"
    [ -n "$start" ] || { say "$name has no ExecStart."; return 1; }
    if [ "$(unit_value "$file" Type)" = "oneshot" ]; then
        run_as_unit "$file" "$(exec_command "$start")" wait >>"$LOG" 2>&1
        return
    fi
    pid="$(run_as_unit "$file" "$(exec_command "$start")" detach)"
    echo "$pid" >"$RUN_DIR/$name.pid"
    start_wanted "$file"
    return 0
}

# Units named in the [Unit] section's Wants= and Requires= start along with this one.
start_wanted() {
    section=
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            \[*\]) section="$line"; continue ;;
        esac
        [ "$section" = "[Unit]" ] || continue
        case "$line" in
            Wants=* | Requires=*)
                for dep in ${line#*=}; do
                    (start_unit "$dep") || say "$dep failed to start"
                done
                ;;
        esac
    done <"$1"
}

stop_unit() {
    name="$(unit_name "$1")"
    pid="$(pid_of "$name")" || { rm -f "$RUN_DIR/$name.pid"; return 0; }
    # The unit runs in its own session (setsid): stop the whole group.
    kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    tries=0
    while [ -d "/proc/$pid" ] && [ $tries -lt 50 ]; do
        sleep 0.1
        tries=$((tries + 1))
    done
    kill -KILL "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    rm -f "$RUN_DIR/$name.pid"
    return 0
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

verb="$1"
[ $# -gt 0 ] && shift
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
            stop_unit "$unit"
            start_unit "$unit" || status=$?
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
