#!/usr/bin/env bash
# reconcile.sh - one pass of the TeamSpace controller (lab steps 3 and 6).
#
# Level-triggered: every pass reads the *whole current state* with three list requests
# (TeamSpaces, managed namespaces, quotas, sent at the same time), asks the plan (cnpa_plan.py,
# beside this script: a pure function of each TeamSpace, its namespace and its quota) what to
# write, and writes only that. A pass over a converged cluster writes nothing at all (the lab's
# grader counts writes). It never deletes: the garbage collector removes a namespace by
# following the ownerReference set here.
#
# Writes of one step go out together, one kubectl process per distinct request: all namespaces
# to create in one `kubectl create -f` of a List, one finalizer patch for every TeamSpace that
# needs it, and so on (a kubectl process costs about 0.07 s; one per write made 200 new
# TeamSpaces take 123 s, docs/benchmark.md). A write that fails in a batch is sent again alone,
# so that its exit status and message belong to exactly one object, and its TeamSpace is left
# out of the later steps of the pass (its status never claims what is not in place).
#
# stdout: one line per write that went through ("teamspace NAME: WHAT"); a converged pass prints
# nothing. stderr (the journal): problems, "TeamSpace NAME: MESSAGE". Problems are also recorded
# as a Kubernetes Event on the TeamSpace (once per distinct problem: the Event's name is derived
# from the TeamSpace's uid, reason and message) and as its Ready condition.
#
# Usage: reconcile.sh          one pass
#        reconcile.sh --plan   print the plan (JSON lines) and write nothing
#
# Environment (all optional):
#   KUBECONFIG            kubeconfig used by kubectl (kubectl's own default otherwise)
#   KUBECTL               kubectl binary (default: kubectl)
#   CNPA_BASE_DIR         base directory (default: /root/cnpa-op)
#   CNPA_ARCHIVE_DIR      archive directory (default: $CNPA_BASE_DIR/archive)
#   CNPA_REQUEST_TIMEOUT  per-request timeout, so an unreachable API fails fast (default: 10s)
#   CNPA_EVENT_NAMESPACE  namespace of the Events recorded on TeamSpaces (default: default, where
#                         Kubernetes puts the Events of cluster-scoped objects)
#   CNPA_PASS_DEADLINE    seconds a whole pass may take (default: 60)
#   CNPA_LOCK_FILE        passes on one host take turns on this lock (default:
#                         /run/cnpa-op/pass.lock): a manual run beside the service waits
#   CNPA_PLAN             the plan module (default: cnpa_plan.py beside this script)
#   CNPA_WRITE_WORKERS    kubectl processes that send one step's writes at the same time
#                         (default: 4; only groups of over 25 writes are split)
#
# Exit status: 0 converged or converging; 1 some TeamSpace could not be reconciled (named on
# stderr, retried next pass); 2 the API server could not be read (nothing was written);
# 3 internal error (bad usage, the plan failed or planned a step this script does not know);
# 4 the archive directory is missing or was replaced (the service's sandbox still sees the old
# one: the service loop exits on 4 so that systemd restarts it with fresh mounts);
# 75 another pass held the lock for too long; 124 the pass ran past its deadline.
set -euo pipefail

BASE_DIR="${CNPA_BASE_DIR:-/root/cnpa-op}"
ARCHIVE_DIR="${CNPA_ARCHIVE_DIR:-$BASE_DIR/archive}"
KUBECTL="${KUBECTL:-kubectl}"
REQUEST_TIMEOUT="${CNPA_REQUEST_TIMEOUT:-10s}"
EVENT_NS="${CNPA_EVENT_NAMESPACE:-default}"
DEADLINE="${CNPA_PASS_DEADLINE:-60}"
LOCK_FILE="${CNPA_LOCK_FILE:-/run/cnpa-op/pass.lock}"
WRITE_WORKERS="${CNPA_WRITE_WORKERS:-4}"
WRITE_SPLIT=25
SELF=$(readlink -f -- "${BASH_SOURCE[0]}")
PLAN="${CNPA_PLAN:-${SELF%/*}/cnpa_plan.py}"

readonly GROUP=platform.labhub.io
readonly LABEL="$GROUP/teamspace"
readonly QUOTA=team-quota
readonly MANAGED_BY="app.kubernetes.io/managed-by=cnpa-op"
# Event reasons of failures only the executor sees (the plan's are constants in cnpa_plan.py,
# which carries them in each planned write). CONFLICT is never an Event: it is routine.
readonly NAMESPACE_NOT_OURS=NamespaceNotOurs ARCHIVE_FAILED=ArchiveFailed CONFLICT=Conflict

# Scratch files of the pass (lists, plan, results, queued Events), removed on exit.
WORK=""
# The kubectl arguments of the request being sent (request()).
ARGS=()
# Set when the archive directory is unusable (the pass ends with exit status 4), and when some
# TeamSpace has a problem no write can fix (exit status 1).
ARCHIVE_BROKEN=0
PROBLEMS=0

log() { printf 'reconcile: %s\n' "$*" >&2; }
say() { printf 'teamspace %s: %s\n' "$1" "$2"; }

# Every call carries a request timeout: a hung API server must not hang the service loop.
k() { "$KUBECTL" --request-timeout="$REQUEST_TIMEOUT" "$@"; }

# written: what kubectl printed with -o json (one document per object, or a List) as lines
# "<key> <resourceVersion> <uid>", the key being the plan's (kind/[namespace/]name).
written() {
  jq -r 'if .kind == "List" then .items[] else . end
         | [([.kind, .metadata.namespace, .metadata.name] | map(select(. != null)) | join("/")),
            .metadata.resourceVersion, .metadata.uid] | @tsv'
}

# A conflict (optimistic concurrency: somebody wrote the object since it was read) is routine and
# retried on the next pass; it is logged but not worth an Event. For our JSON patches, "rejected
# our request" (422, no details from kubectl) means a test op failed: the list changed meanwhile.
is_conflict() {
  grep -qE 'has been modified|testing value .* failed|\(Conflict\)|rejected our request due to an error in our request' <<<"$1"
}

# fail ROW REASON MESSAGE: a write for one TeamSpace did not go through. It is left out of the
# later steps; the owner learns why from an Event and the Ready condition (conflicts excepted).
fail() {
  local row=$1 reason=$2 msg=$3 name uid step
  IFS=$'\t' read -r name uid step < <(jq -r '[.teamspace, .uid, .step] | @tsv' <<<"$row")
  printf '%s\n' "$name" >>"$WORK/failed"
  log "TeamSpace $name: $msg"
  if [[ $reason == "$CONFLICT" ]]; then
    return
  fi
  event "$name" "$uid" Warning "$reason" "$msg"
  if [[ $step != status ]]; then
    printf '%s\t%s\t%s\n' "$name" "$reason" "$msg" >>"$WORK/failures"
  fi
}

# event NAME UID TYPE REASON MESSAGE: queue an Event on a TeamSpace, so that the user who owns it
# sees the problem without reading the controller's journal; events() writes the queue. The name
# is derived from (uid, reason, message): an Event that already exists is never written again,
# which bounds Events to one per distinct problem instead of one per pass.
event() {
  local name=$1 uid=$2 type=$3 reason=$4 msg=$5 hash
  [[ -n $uid ]] || return 0
  hash=$(printf '%s\n%s\n%s' "$uid" "$reason" "$msg" | sha256sum | cut -c1-16)
  # The message goes through a file: it may be long, and arguments are limited (128 KiB each).
  printf '%s' "$msg" >"$WORK/event.msg"
  jq -cn --arg n "${name:0:200}.cnpa.$hash" --arg ns "$EVENT_NS" --arg ts "$name" --arg uid "$uid" \
         --arg type "$type" --arg reason "$reason" --rawfile msg "$WORK/event.msg" --arg g "$GROUP" \
         --arg now "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --arg mb "${MANAGED_BY#*=}" '
    {apiVersion: "v1", kind: "Event",
     metadata: {name: $n, namespace: $ns, labels: {"app.kubernetes.io/managed-by": $mb}},
     involvedObject: {apiVersion: "\($g)/v1alpha1", kind: "TeamSpace", name: $ts, uid: $uid},
     type: $type, reason: $reason, message: $msg[0:1024], count: 1,
     firstTimestamp: $now, lastTimestamp: $now, source: {component: "cnpa-op"}}' >>"$WORK/events"
}

# events: write the queued Events that do not exist yet, in one call. Best effort: a failure is
# logged, never fatal. A pass with nothing queued makes no request at all.
events() {
  [[ -s $WORK/events ]] || return 0
  if ! k get events -n "$EVENT_NS" -l "$MANAGED_BY" \
         -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' >"$WORK/events.have"; then
    log "cannot list Events in $EVENT_NS; not recording this pass's"
    return 0
  fi
  jq -cs --rawfile have "$WORK/events.have" '
      ($have | split("\n") | map({key: ., value: true}) | from_entries) as $have
      | map(select($have[.metadata.name] | not)) | unique_by(.metadata.name)
      | select(length > 0) | {apiVersion: "v1", kind: "List", items: .}' \
    "$WORK/events" >"$WORK/events.new"
  [[ -s $WORK/events.new ]] || return 0
  if ! k create --validate=false -f "$WORK/events.new" -o json 2>"$WORK/events.err" |
         jq -r 'if .kind == "List" then .items[] else . end
                | "teamspace \(.involvedObject.name): event \(.type) \(.reason) recorded"'; then
    cat -- "$WORK/events.err" >&2
    log "could not record some Events"
  fi
}

# request ROW: the kubectl arguments of a planned write (verb, patch type and body, subresource)
# in ARGS.
request() {
  local verb ptype sub
  IFS=$'\t' read -r verb ptype sub < <(jq -r '[.verb, .patch_type, .subresource]
                                              | map(if . == "" or . == null then "-" else . end) | @tsv' <<<"$1")
  ARGS=("$verb")
  if [[ $verb == patch ]]; then
    jq -c '.patch' <<<"$1" >"$WORK/patch"
    ARGS+=(--type "$ptype" --patch-file "$WORK/patch")
  else
    ARGS+=(--validate=false)  # (kubectl patch has no such flag and never validates)
  fi
  [[ $sub == - ]] || ARGS+=("--subresource=$sub")
}

# send: the step's rows ($WORK/rows, one planned write per line) to the API server. Rows that
# make the same request (verb, patch type, subresource, patch body) go in one kubectl call naming
# all their objects in a List (--validate=false: the API server validates anyway; kubectl would
# first download the whole OpenAPI schema). A row that did not come back written is resent
# alone, or its fallback request is (a quota's unguarded patch), and what kubectl says then is
# about that row only.
send() {
  local group n row
  jq -c -s 'group_by([.verb, .patch_type, .subresource, (.patch | tojson)])[]' "$WORK/rows" \
    >"$WORK/groups"
  while IFS= read -r group; do
    printf '%s\n' "$group" >"$WORK/group"
    n=$(jq length "$WORK/group")
    request "$(jq -c '.[0]' "$WORK/group")"
    send_lists "$n"
    jq -c '.[]' "$WORK/group" | outcome
    mv -- "$WORK/retry" "$WORK/retry.group"
    while IFS= read -r row; do
      if [[ $(jq 'has("fallback")' <<<"$row") == true ]] || ((n > 1)); then
        row=$(jq -c 'if .fallback then . + .fallback | del(.fallback) else . end' <<<"$row")
        request "$row"
        jq -c '{apiVersion: "v1", kind: "List", items: [.object]}' <<<"$row" >"$WORK/objects"
        { k "${ARGS[@]}" -f "$WORK/objects" -o json 2>"$WORK/send.err" || true; } | written >"$WORK/sent"
        outcome <<<"$row"
        [[ -s $WORK/retry ]] || continue
      fi
      failed_write "$row" "$(grep -v '^$' "$WORK/send.err" | tail -n 1)"
    done <"$WORK/retry.group"
  done <"$WORK/groups"
}

# send_lists N: the N objects of $WORK/group to the API server with the request in ARGS. kubectl
# sends a List's objects one after the other and each write waits for etcd, so a large group is
# cut into up to WRITE_WORKERS Lists of at least WRITE_SPLIT objects, sent at the same time
# (200 status updates: one request after the other took as long as everything else in a pass).
# Written objects go to $WORK/sent, kubectl's messages to $WORK/send.err.
send_lists() {
  local n=$1 parts i pids=()
  parts=$(((n + WRITE_SPLIT - 1) / WRITE_SPLIT))
  ((parts <= WRITE_WORKERS)) || parts=$WRITE_WORKERS
  ((parts >= 1)) || parts=1
  rm -f -- "$WORK"/objects.* "$WORK"/sent.* "$WORK"/send.err.*
  jq -c --argjson parts "$parts" '
      ((length + $parts - 1) / $parts | floor) as $size
      | range(0; length; $size) as $i | {apiVersion: "v1", kind: "List", items: (.[$i:$i + $size] | map(.object))}' \
    "$WORK/group" | {
    i=0
    while IFS= read -r list; do
      printf '%s\n' "$list" >"$WORK/objects.$i"
      { k "${ARGS[@]}" -f "$WORK/objects.$i" -o json 2>"$WORK/send.err.$i" || true; } |
        written >"$WORK/sent.$i" &
      pids+=($!)
      i=$((i + 1))
    done
    ((${#pids[@]} == 0)) || wait "${pids[@]}" || true
  }
  cat -- "$WORK"/sent.* >"$WORK/sent" 2>/dev/null || : >"$WORK/sent"
  cat -- "$WORK"/send.err.* >"$WORK/send.err" 2>/dev/null || : >"$WORK/send.err"
}

# outcome: for the rows on stdin, against what kubectl returned ($WORK/sent): say what went
# through and queue its Event; the rows that did not come back go to $WORK/retry.
outcome() {
  local what name uid type reason msg
  cat -- "$WORK/sent" >>"$WORK/written"
  jq -nc --rawfile sent "$WORK/sent" '
      ($sent | split("\n") | map(select(. != "") | split("\t")[0] | {key: ., value: true}) | from_entries) as $sent
      | inputs | {row: ., ok: ($sent[.key] == true)}' >"$WORK/outcome"
  jq -c 'select(.ok | not) | .row' "$WORK/outcome" >"$WORK/retry"
  jq -r 'select(.ok) | .row | ["say", .teamspace, .uid, "-", "-", .says],
           (select(.event != null) | ["event", .teamspace, .uid, .event.type, .event.reason, .event.message])
         | @tsv' "$WORK/outcome" |
    while IFS=$'\t' read -r what name uid type reason msg; do
      if [[ $what == say ]]; then
        say "$name" "$msg"
      else
        event "$name" "$uid" "$type" "$reason" "$msg"
      fi
    done
}

# failed_write ROW ERROR: why one object's write failed, from its own kubectl error.
failed_write() {
  local row=$1 err=$2 step op name
  IFS=$'\t' read -r step op name < <(jq -r '[.step, .op, .teamspace] | @tsv' <<<"$row")
  if is_conflict "$err"; then
    fail "$row" "$CONFLICT" "$step $op conflicted with another write (${err:-no message}); retrying on the next pass"
  elif [[ $step == namespace && $op == create && $err == *AlreadyExists* ]]; then
    # The list sees only namespaces with our label: this one is somebody else's.
    fail "$row" "$NAMESPACE_NOT_OURS" "namespace team-$name already exists and is not managed by cnpa-op (no $LABEL=$name label); not adopting or modifying it - delete or rename it"
  else
    fail "$row" "${step^}${op^}Failed" "$step $op failed: ${err:-kubectl gave no message}; retrying on the next pass"
  fi
}

# archive_step: write the archive record of every deleting TeamSpace (once per uid), flushed to
# disk (file and directory) before its finalizer may be released. The record of an earlier
# TeamSpace of the same name is kept beside it as NAME.UID.json.
archive_step() {
  local row name uid record file old keep
  if [[ -d $ARCHIVE_DIR && $(stat -L -c %h -- "$ARCHIVE_DIR") == 0 ]] ||
     ! mkdir -p -- "$ARCHIVE_DIR" 2>/dev/null ||
     [[ ,$(findmnt -n -o OPTIONS -T "$ARCHIVE_DIR" 2>/dev/null), == *,ro,* ]]; then
    # The sandbox binds the directory as it was when the service started. Removed or replaced
    # on the host since, the service sees a deleted directory (link count 0) or, once the
    # kernel has detached that bind mount, the read-only file system beneath; missing at the
    # start, it cannot be made. A restart binds the directory anew.
    ARCHIVE_BROKEN=1
  fi
  # A pass killed between mktemp and mv leaves a temporary file: swept once, before this pass
  # makes its own. Not per record: a listing per record grows with every record ever archived.
  ((ARCHIVE_BROKEN)) || rm -f -- "$ARCHIVE_DIR/."*.json.?????? 2>/dev/null || true
  while IFS= read -r row; do
    IFS=$'\t' read -r name uid < <(jq -r '[.teamspace, .uid] | @tsv' <<<"$row")
    if ((ARCHIVE_BROKEN)); then
      fail "$row" "$ARCHIVE_FAILED" "archive directory $ARCHIVE_DIR is missing or was replaced while cnpa-op runs; keeping the finalizer until the service restarts (deletion waits)"
      continue
    fi
    record=$(jq -c '.record' <<<"$row")
    file="$ARCHIVE_DIR/$name.json"
    ((${#name} <= 240)) || file="$ARCHIVE_DIR/$uid.json"
    if [[ -f $file ]] && [[ $(<"$file") == "$record" ]]; then
      continue  # archived by an earlier pass
    fi
    if [[ -f $file ]]; then
      old=$(jq -r '.uid // empty' -- "$file" 2>/dev/null || true)
      if [[ -n $old && $old != "$uid" ]]; then
        keep="$ARCHIVE_DIR/$name.$old.json"
        ((${#name} <= 200)) || keep="$ARCHIVE_DIR/$old.json"
        # Made like the record (temporary file, flushed, renamed): a full disk or a crash
        # leaves no torn copy for a later pass to take for a good one. A copy that is there
        # must be the earlier record byte for byte, or it is made again.
        if ! cmp -s -- "$file" "$keep" && ! write_durably "$name" "$keep" <"$file"; then
          fail "$row" "$ARCHIVE_FAILED" "cannot keep the earlier record of $name as $keep; keeping the finalizer, deletion waits"
          continue
        fi
      fi
    fi
    if printf '%s\n' "$record" | write_durably "$name" "$file"; then
      say "$name" "archived to $file"
    else
      fail "$row" "$ARCHIVE_FAILED" "cannot write $file; keeping the finalizer, deletion waits"
    fi
  done <"$WORK/rows"
}

# write_durably NAME PATH <TEXT: PATH holds stdin in full, on disk (file and directory flushed),
# or is left as it was. The temporary file is .NAME.json.XXXXXX, which a later pass sweeps.
write_durably() {
  local tmp
  if tmp=$(mktemp -- "$ARCHIVE_DIR/.$1.json.XXXXXX") && cat >"$tmp" && sync -- "$tmp" &&
     mv -f -- "$tmp" "$2" && sync -- "$ARCHIVE_DIR"; then
    return 0
  fi
  rm -f -- "${tmp:-}"
  return 1
}

# problem_step: what no write can fix; reported (journal, Event) pass after pass until fixed.
problem_step() {
  local name uid reason msg
  PROBLEMS=1
  jq -r '[.teamspace, .uid, .event.reason, .event.message] | @tsv' "$WORK/rows" |
    while IFS=$'\t' read -r name uid reason msg; do
      log "TeamSpace $name: $msg"
      event "$name" "$uid" Warning "$reason" "$msg"
    done
}

# rows STEP: the plan's rows of one step whose TeamSpace has not failed earlier in the pass, with
# what the pass learnt filled in: a status replace carries the resourceVersion our finalizer
# patch returned (else it would conflict with our own write) and the uid of the namespace
# created a moment ago.
rows() {
  # -n and inputs: the lookup tables are built once, not once per row.
  jq -nc --arg step "$1" --rawfile failed "$WORK/failed" --rawfile written "$WORK/written" '
      ($failed | split("\n") | map({key: ., value: true}) | from_entries) as $failed
      | ($written | split("\n") | map(split("\t") | select(length == 3) | {key: .[0], value: {rv: .[1], uid: .[2]}})
         | from_entries) as $w
      | inputs
      | select(.step == $step and ($failed[.teamspace] | not))
      | if .step == "status" then
          .object.metadata.resourceVersion = ($w[.key].rv // .object.metadata.resourceVersion)
          | if .fill.namespaceUID then .object.status.namespaceUID = $w[.fill.namespaceUID].uid else . end
        else . end' "$2" >"$WORK/rows"
}

# apply_plan: the plan's steps in the order it gives them (cnpa_plan.STEPS), each step's writes
# together. A step this script does not know is an error, not a write skipped in silence.
apply_plan() {
  local step
  for step in $(jq -r '.step' "$WORK/plan" | uniq); do
    rows "$step" "$WORK/plan"
    [[ -s $WORK/rows ]] || continue
    case $step in
      problem) problem_step ;;
      archive) archive_step ;;
      finalizer | release | namespace | quota | status) send ;;
      *) log "the plan has a step this script does not know: $step; pass aborted"; return 3 ;;
    esac
  done
  # Writes that failed for a reason the owner should see: Ready False, once.
  if [[ -s $WORK/failures ]]; then
    python3 -S "$PLAN" failed "$NOW" "$WORK/teamspaces" "$WORK/failures" >"$WORK/plan.failed" || {
      log "the plan module failed on this pass's failures"; return 3; }
    # The failed TeamSpaces are the ones to write now: start a fresh list for this last step.
    mv -- "$WORK/failed" "$WORK/failed.pass"
    : >"$WORK/failed"
    rows status "$WORK/plan.failed"
    [[ ! -s $WORK/rows ]] || send
  fi
}

main() {
  local rc=0 ts nss quotas
  if [[ $# -gt 1 || ($# -eq 1 && $1 != --plan) ]]; then
    log "usage: reconcile.sh [--plan]"
    return 3
  fi
  WORK=$(mktemp -d) || { log "cannot create a temporary directory; pass aborted"; return 2; }
  trap 'rm -rf -- "$WORK"' EXIT
  : >"$WORK/failed"
  : >"$WORK/failures"
  : >"$WORK/written"
  : >"$WORK/events"
  NOW=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # Three list requests per pass, whatever the number of TeamSpaces, at the same time. --raw:
  # the API server's JSON as it comes; `-o json` would decode and re-encode every object in
  # kubectl (2.5 times the CPU for 200 TeamSpaces).
  k get --raw "/apis/$GROUP/v1alpha1/teamspaces" >"$WORK/teamspaces" 2>"$WORK/teamspaces.err" &
  ts=$!
  k get --raw "/api/v1/namespaces?labelSelector=${LABEL//\//%2F}" \
    >"$WORK/namespaces" 2>"$WORK/namespaces.err" &
  nss=$!
  k get --raw "/api/v1/resourcequotas?fieldSelector=metadata.name%3D$QUOTA" \
    >"$WORK/quotas" 2>"$WORK/quotas.err" &
  quotas=$!
  wait "$ts" || rc=2
  wait "$nss" || rc=2
  wait "$quotas" || rc=2
  if ((rc)); then
    cat -- "$WORK"/*.err >&2
    log "cannot list TeamSpaces, namespaces or quotas (API server unreachable or CRD missing?); pass aborted, nothing written"
    return 2
  fi
  # -S: the plan needs nothing beyond the standard library; skipping site-packages saves time.
  if ! python3 -S "$PLAN" plan "$NOW" "$WORK/teamspaces" "$WORK/namespaces" "$WORK/quotas" >"$WORK/plan"; then
    log "the plan module ($PLAN) failed; pass aborted, nothing written"
    return 3
  fi
  if [[ $# -eq 1 ]]; then
    cat -- "$WORK/plan"
    return 0
  fi
  [[ -s $WORK/plan ]] || return 0
  apply_plan || return
  events
  if ((ARCHIVE_BROKEN)); then
    return 4
  fi
  if [[ -s $WORK/failed || -s $WORK/failed.pass ]] || ((PROBLEMS)); then
    return 1
  fi
}

# The deadline and the lock wrap the whole pass: re-run this script under timeout(1), which kills
# the pass and the kubectl processes it started when the time is up (exit status 124).
if [[ -z ${CNPA_PASS_STARTED:-} ]]; then
  export CNPA_PASS_STARTED=1
  if [[ ! $DEADLINE =~ ^[1-9][0-9]{0,4}$ || ! $WRITE_WORKERS =~ ^[1-9][0-9]?$ ]]; then
    log "CNPA_PASS_DEADLINE must be 1-99999 (seconds) and CNPA_WRITE_WORKERS 1-99; pass aborted"
    exit 3
  fi
  if [[ ${1:-} != --plan ]]; then
    mkdir -p -- "${LOCK_FILE%/*}" 2>/dev/null || true
    if ! exec 9>>"$LOCK_FILE"; then
      log "cannot open the lock file $LOCK_FILE (set CNPA_LOCK_FILE); pass aborted"
      exit 3
    fi
    if ! flock -w "$((DEADLINE > 2 ? DEADLINE / 2 : 1))" 9; then
      log "another pass has held $LOCK_FILE for over $((DEADLINE > 2 ? DEADLINE / 2 : 1)) s; this one gives up"
      exit 75
    fi
  fi
  rc=0
  timeout --kill-after=5 "$DEADLINE" bash "$SELF" "$@" 9>&- || rc=$?
  if ((rc == 124 || rc == 137)); then
    log "the pass ran past its deadline of $DEADLINE s (CNPA_PASS_DEADLINE) and was stopped"
    rc=124
  fi
  exit "$rc"
fi
main "$@"
