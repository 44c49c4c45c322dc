#!/usr/bin/env bash
# reconcile.sh - one pass of the TeamSpace controller (lab steps 3 and 6).
#
# Level-triggered: every pass reads the *whole current state* with a constant number of list
# requests (TeamSpaces, managed namespaces, quotas, sent at the same time), computes the
# difference to the desired state in one jq program, and writes only what differs. A pass over a
# converged cluster therefore writes nothing at all (the lab's grader counts writes). It never
# deletes namespaces: the garbage collector does that by following the ownerReference set here.
#
# Writes of one kind go out together, from one kubectl process: all namespaces to create in one
# `kubectl create -f -` of a List, all finalizers to add in one `kubectl patch` naming every
# TeamSpace, and so on. The API server still gets one request per object; what is saved is a
# kubectl process per object (about 0.07 s each: 200 new TeamSpaces took 123 s one process per
# write, see docs/benchmark.md).
#
# Environment (all optional):
#   KUBECONFIG            kubeconfig used by kubectl (kubectl's own default otherwise)
#   KUBECTL               kubectl binary (default: kubectl)
#   CNPA_BASE_DIR         base directory (default: /root/cnpa-op)
#   CNPA_ARCHIVE_DIR      archive directory (default: $CNPA_BASE_DIR/archive)
#   CNPA_REQUEST_TIMEOUT  per-request timeout, so an unreachable API fails fast (default: 10s)
#   CNPA_EVENT_NAMESPACE  namespace of the Events recorded on TeamSpaces (default: default, where
#                         Kubernetes puts the Events of cluster-scoped objects)
#
# Per-TeamSpace problems go to stderr (the journal) *and* become a Kubernetes Event on the
# TeamSpace (`kubectl get events -n default --field-selector involvedObject.name=<name>`). Events
# are bounded: at most one per TeamSpace uid and distinct (reason, message); a problem that
# persists pass after pass is not re-emitted (its Event already exists), so a failing pass writes
# at most once and a converged pass never touches Events at all (not even a list request).
#
# Exit status: 0 converged or converging, 1 some TeamSpace could not be reconciled (named on
# stderr, retried next pass), 2 the API server could not be read (nothing was written).
set -euo pipefail

BASE_DIR="${CNPA_BASE_DIR:-/root/cnpa-op}"
ARCHIVE_DIR="${CNPA_ARCHIVE_DIR:-$BASE_DIR/archive}"
KUBECTL="${KUBECTL:-kubectl}"
REQUEST_TIMEOUT="${CNPA_REQUEST_TIMEOUT:-10s}"
EVENT_NS="${CNPA_EVENT_NAMESPACE:-default}"

readonly GROUP=platform.labhub.io
# resource.version.group: with the version named, kubectl maps it from its discovery cache instead
# of re-reading the whole API discovery (about 40 requests) on every call (bench/NOTES.md).
readonly TEAMSPACES="teamspaces.v1alpha1.$GROUP"
readonly FINALIZER="$GROUP/cleanup"
readonly LABEL="$GROUP/teamspace"
readonly QUOTA=team-quota
readonly MANAGED_BY="app.kubernetes.io/managed-by=cnpa-op"

# The order in which writes happen. A TeamSpace whose write fails is left out of the later steps
# of the pass, so its status never claims what is not in place; the other TeamSpaces carry on.
readonly STEPS="teamspace:error finalizer:remove finalizer:dedup finalizer:add finalizer:append
namespace:create namespace:patch quota:create quota:update status:update"

# Scratch files of the pass (lists, step results, queued Events), removed on exit.
WORK=""

log() { printf 'reconcile: %s\n' "$*" >&2; }

# Every call carries a request timeout: a hung API server must not hang the service loop.
k() { "$KUBECTL" --request-timeout="$REQUEST_TIMEOUT" "$@"; }

# The whole diff, in one process. Input: the three lists. Output: one tab-separated line per
# write that is needed, "<teamspace> <function> <op> <json> <json> <uid>". Problems that a write
# cannot fix become "teamspace ... error" lines so that they are reported under the TeamSpace's
# name. Finalizer changes are JSON patches, the same patch for most TeamSpaces (so that one
# kubectl call can send it to all of them); the other writes carry whole objects.
read -r -d '' PLAN <<'JQ' || true
# Quantity -> integer in nano-units, or null when the string is not a quantity. Lets "500m" equal
# "0.5" and "1" equal "1000m" (the API server canonicalises quota values, TeamSpace specs are raw).
def canon:
  if type == "number" then (. * 1e9 | round)
  elif type != "string" then null
  else (capture("^(?<n>[0-9]+([.][0-9]+)?|[.][0-9]+)(?<s>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][0-9]+)?$") // null) as $m
    | if $m == null then null else
        ($m.s // "") as $s
        | ({"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
            "Ki": 1024, "Mi": 1048576, "Gi": 1073741824, "Ti": 1099511627776,
            "Pi": 1125899906842624, "Ei": 1152921504606846976}[$s]
           // (if ($s | test("^[eE]")) then pow(10; ($s[1:] | tonumber)) else null end)) as $mult
        | (($m.n | tonumber) * $mult * 1e9 | round)
      end
  end;
# Called with the TeamSpace as input (.), whose uid ends the row (the Event's involvedObject).
def row($name; $fn; $op; $a; $b): [$name, $fn, $op, ($a | tojson), ($b | tojson), .metadata.uid] | join("\t");
# An object as read, ready to be sent back: managedFields stay as the server has them.
def unread: del(.metadata.managedFields);

[inputs] as [$ts, $nss, $quotas]
| ($nss.items | map({key: .metadata.name, value: .}) | from_entries) as $nsmap
| ($quotas.items | map({key: .metadata.namespace, value: .}) | from_entries) as $qmap
| $ts.items[]
| . as $t
| $t.metadata.name as $name
| ("team-" + $name) as $nsname
| ($t.metadata.finalizers // []) as $fins
| ($fins | to_entries | map(select(.value == $F)) | .[0].key) as $fidx
| if $t.metadata.deletionTimestamp then
    # Deletion requested: archive, then release our finalizer (by index, guarded by a test so a
    # concurrent edit of the list makes the patch fail instead of removing someone else's entry).
    if $fidx == null then empty else
      row($name; "finalizer"; "remove";
          [{op: "test", path: "/metadata/finalizers/\($fidx)", value: $F},
           {op: "remove", path: "/metadata/finalizers/\($fidx)"}];
          {name: $name, uid: $t.metadata.uid, pods: $t.spec.pods})
    end
  else
    ($t.spec.cpu // "1") as $cpu
    | {apiVersion: "\($G)/v1alpha1", kind: "TeamSpace", name: $name, uid: $t.metadata.uid,
       controller: true, blockOwnerDeletion: true} as $owner
    | {pods: ($t.spec.pods | tostring), "requests.cpu": $cpu} as $hard
    | $nsmap[$nsname] as $ns
    | $qmap[$nsname] as $q
    | (($ns.metadata.ownerReferences // []) | map(select(.controller == true))) as $ctrl
    | if ($nsname | (length > 63) or (test("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$") | not)) then
        row($name; "teamspace"; "error";
            "namespace name \($nsname) is not a valid DNS label (lowercase letters, digits, '-'; at most 63); rename the TeamSpace";
            "InvalidName")
      elif ($cpu | canon) == null then
        row($name; "teamspace"; "error"; "spec.cpu \($cpu | tojson) is not a quantity (e.g. \"1\", \"500m\")"; "InvalidCPU")
      elif $ns.metadata.deletionTimestamp then
        row($name; "teamspace"; "error"; "namespace \($nsname) is terminating; waiting for it to go"; "NamespaceTerminating")
      elif $ns != null and $ns.metadata.labels[$L] != $name then
        row($name; "teamspace"; "error"; "namespace \($nsname) is labelled for TeamSpace \($ns.metadata.labels[$L] | tojson), not adopting it"; "NamespaceNotOurs")
      elif ($ctrl | map(select(.uid != $t.metadata.uid)) | length) > 0 then
        row($name; "teamspace"; "error"; "namespace \($nsname) is controlled by \($ctrl[0].kind)/\($ctrl[0].name) uid \($ctrl[0].uid), not this TeamSpace; waiting for the garbage collector"; "NamespaceOwnedByOther")
      else
        # Finalizer first: once a namespace exists, deleting the TeamSpace must wait for us.
        (if $fidx != null then
           # Ours twice (two passes racing, e.g. a manual run beside the service): drop the last.
           ([$fins | to_entries[] | select(.value == $F) | .key] | .[1:] | last) as $dup
           | if $dup == null then empty else
               row($name; "finalizer"; "dedup";
                   [{op: "test", path: "/metadata/finalizers/\($dup)", value: $F},
                    {op: "remove", path: "/metadata/finalizers/\($dup)"}]; null)
             end
         elif $t.metadata.finalizers == null then
           # No list yet: create it only if there still is none (a test of null passes only for
           # a missing list), so that a list another client adds meanwhile is never replaced.
           row($name; "finalizer"; "add";
               [{op: "test", path: "/metadata/finalizers", value: null},
                {op: "add", path: "/metadata/finalizers", value: [$F]}]; null)
         else
           # Append, unguarded: the server appends to the list as it is at that moment, so other
           # clients' entries stay even if they were added a moment ago.
           row($name; "finalizer"; "append"; [{op: "add", path: "/metadata/finalizers/-", value: $F}]; null)
         end),
        (if $ns == null then
           row($name; "namespace"; "create";
               {apiVersion: "v1", kind: "Namespace",
                metadata: {name: $nsname, labels: {($L): $name}, ownerReferences: [$owner]}}; null)
         elif (($ns.metadata.ownerReferences // []) | index([$owner])) == null then
           # Labelled ours but the reference is missing or altered: restore it, keep other owners.
           # resourceVersion in a merge patch makes it conditional (optimistic concurrency).
           row($name; "namespace"; "patch";
               {metadata: {resourceVersion: $ns.metadata.resourceVersion,
                           ownerReferences: ((($ns.metadata.ownerReferences // [])
                                              | map(select(.uid != $t.metadata.uid))) + [$owner])}}; null)
         else empty end),
        (if $q != null and ($q.spec.scopes != null or $q.spec.scopeSelector != null) then
           # Scopes narrow what a quota counts and are immutable: no patch can fix them, and the
           # controller may not delete. Say what to do; the quota is recreated once it is gone.
           row($name; "teamspace"; "error";
               "quota \($Q) in \($nsname) has scopes \($q.spec | {scopes, scopeSelector} | with_entries(select(.value != null)) | tojson), which cannot be changed; delete it and it is recreated";
               "QuotaScoped")
         elif $q == null then
           row($name; "quota"; "create";
               {apiVersion: "v1", kind: "ResourceQuota",
                metadata: {name: $Q, namespace: $nsname, labels: {($L): $name}},
                spec: {hard: $hard}}; null)
         elif ((($q.spec.hard // {}) | keys) != ($hard | keys))
              or ([$hard | keys[] as $k | ($q.spec.hard[$k] | canon) == ($hard[$k] | canon)] | all | not) then
           # The quota as read, with exactly the desired limits, replaced only if nobody wrote it
           # since (resourceVersion). With the spec unchanged since it was last reconciled, the
           # difference is an edit of the quota: a revert, which is worth an Event.
           row($name; "quota"; "update";
               ($q | unread | .spec.hard = $hard);
               ($t.status.observedGeneration == $t.metadata.generation
                | {revert: .,
                   message: (if . then "quota \($Q) in \($nsname) was \($q.spec.hard // {} | tojson); set back to \($hard | tojson)"
                             else "quota \($Q) in \($nsname) set to \($hard | tojson) (generation \($t.metadata.generation))" end)}))
         else empty end),
        # Status last: it is only reached when every write above succeeded, so observedGeneration
        # never claims a generation whose namespace and quota are not in place.
        (if ($t.status.observedGeneration != $t.metadata.generation) or ($t.status.namespace != $nsname) then
           row($name; "status"; "update";
               ($t | unread | .status = ((.status // {}) + {observedGeneration: .metadata.generation, namespace: $nsname}));
               null)
         else empty end)
      end
  end
JQ

# written: what kubectl printed with -o json (one document per object, or a List) as lines
# "<teamspace> ok <resourceVersion>": the TeamSpace behind each object that was written.
written() {
  jq -r 'if .kind == "List" then .items[] else . end
         | [if .kind == "TeamSpace" then .metadata.name
            else (.metadata.namespace // .metadata.name) | ltrimstr("team-") end,
            "ok", .metadata.resourceVersion] | @tsv'
}

# batch VERB [FLAG...]: the objects on stdin, one per line, as one List to `kubectl VERB -f -`.
# kubectl goes on after an object fails; its error, naming the object, goes to stderr.
# --validate=false: the API server validates anyway; kubectl would first download the server's
# whole OpenAPI schema to check the objects itself.
batch() {
  jq -cs '{apiVersion: "v1", kind: "List", items: .}' |
    { k "$@" --validate=false -f - -o json || true; } | written
}

# patches: JSON-patch TeamSpaces ("<name> <patch>" lines on stdin) with one kubectl call per
# distinct patch, for every TeamSpace it goes to. Finalizer patches are mostly alike (append ours;
# create the list; remove the first entry), so a pass needs one or two calls, not one per
# TeamSpace. The TeamSpaces are named in a List on stdin, not as arguments: given names, kubectl
# first reads each object, at its client-side limit of 5 requests per second (50 TeamSpaces: 8 s;
# this way 0.3 s).
patches() {
  local body names
  awk -F'\t' '{ to[$2] = to[$2] " " $1 } END { for (p in to) print p "\t" to[p] }' |
    while IFS=$'\t' read -r body names; do
      # shellcheck disable=SC2086 # a list of names (DNS names: no spaces, no globs)
      jq -n --arg g "$GROUP" '{apiVersion: "v1", kind: "List", items: [$ARGS.positional[]
               | {apiVersion: "\($g)/v1alpha1", kind: "TeamSpace", metadata: {name: .}}]}' \
         --args $names |
        { k patch -f - --type json -p "$body" -o json || true; } | written
    done
}

# A conflict (optimistic concurrency: somebody wrote the object since it was read) is routine and
# retried on the next pass; it is logged but not worth an Event. For our JSON patches, "rejected
# our request" (422, no details from kubectl) means a test op failed: the list changed meanwhile.
is_conflict() {
  grep -qE 'has been modified|testing value .* failed|Conflict|rejected our request due to an error in our request' <<<"$1"
}

# event NAME UID TYPE REASON MESSAGE: queue an Event on a TeamSpace, so that the user who owns it
# sees the problem without reading the controller's journal; events() writes the queue. The name
# is derived from (uid, reason, message): an Event that already exists is never written again,
# which bounds Events to one per distinct problem instead of one per pass.
event() {
  local name=$1 uid=$2 type=$3 reason=$4 msg=$5 hash
  [[ -n $uid ]] || return 0
  hash=$(printf '%s\n%s\n%s' "$uid" "$reason" "$msg" | sha256sum | cut -c1-16)
  jq -cn --arg n "${name:0:200}.cnpa.$hash" --arg ns "$EVENT_NS" --arg ts "$name" --arg uid "$uid" \
         --arg type "$type" --arg reason "$reason" --arg msg "$msg" --arg g "$GROUP" \
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
  local have
  [[ -s $WORK/events ]] || return 0
  if ! have=$(k get events -n "$EVENT_NS" -l "$MANAGED_BY" \
                -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'); then
    log "cannot list Events in $EVENT_NS; not recording this pass's"
    return 0
  fi
  jq -cs --arg have "$have" '
      ($have | split("\n") | map({key: ., value: true}) | from_entries) as $have
      | map(select($have[.metadata.name] | not)) | unique_by(.metadata.name)
      | select(length > 0) | {apiVersion: "v1", kind: "List", items: .}' \
    "$WORK/events" >"$WORK/events.new"
  if [[ -s $WORK/events.new ]] &&
     ! k create --validate=false -f "$WORK/events.new" -o name >/dev/null; then
    log "could not record some Events"
  fi
}

# Each step below reads its rows, "<teamspace> <json> <json> <uid>", on stdin and prints
# "<teamspace> ok [<resourceVersion>]" for every TeamSpace whose write went through, or
# "<teamspace> <Reason> <message>" for a failure it can explain. main() takes every other row as
# failed, with kubectl's error.

# teamspace: a problem with the TeamSpace itself that no write can fix; reported, retried later.
teamspace() {
  jq -rR 'split("\t") | [.[0], (.[2] | fromjson), (.[1] | fromjson)] | @tsv'
}

# archive NAME RECORD: the archive record, written atomically (temporary file, then rename).
archive() {
  local name=$1 record=$2 tmp
  # A pass killed between mktemp and mv leaves a temporary file; the next attempt removes it.
  rm -f -- "$ARCHIVE_DIR/.$name.json."?????? 2>/dev/null || true
  mkdir -p -- "$ARCHIVE_DIR" && tmp=$(mktemp -- "$ARCHIVE_DIR/.$name.json.XXXXXX") || return 1
  if ! { printf '%s\n' "$record" >"$tmp" && mv -f -- "$tmp" "$ARCHIVE_DIR/$name.json"; }; then
    rm -f -- "$tmp"
    return 1
  fi
}

# finalizer: add ours before anything exists that deletion must clean up, drop a duplicate, or,
# on deletion, write the archive record and only then release ours (if the archive cannot be
# written the finalizer stays and deletion waits). All by JSON patches against the list as the
# server has it when the patch arrives, never a whole list sent back: an earlier version replaced
# the list guarded by resourceVersion and lost every race against a client editing the list all
# the time (tests/faults: 50 edits by another client). The resourceVersions the patches return
# go to status(), which must not conflict with our own write.
finalizer() {
  local op=$1 name patch record
  if [[ $op == remove ]]; then
    : >"$WORK/archived"
    while IFS=$'\t' read -r name patch record _; do
      if archive "$name" "$record"; then
        printf '%s\t%s\n' "$name" "$patch" >>"$WORK/archived"
      else
        printf '%s\tArchiveFailed\t%s\n' "$name" \
          "cannot write $ARCHIVE_DIR/$name.json; keeping the finalizer, deletion waits"
      fi
    done
    patches <"$WORK/archived"
  else
    cut -f1,2 | patches | tee -a "$WORK/versions"
  fi
}

# namespace create: team-<name>, labelled and owned by the TeamSpace. AlreadyExists means a
# namespace without our label (the list sees only labelled ones): somebody else's. It is never
# adopted nor modified; the message says so. namespace patch: restore our ownerReference.
namespace() {
  local op=$1 name patch
  if [[ $op == patch ]]; then
    while IFS=$'\t' read -r name patch _; do
      { k patch namespace "team-$name" --type merge -p "$patch" -o json || true; } | written
    done
    return
  fi
  cut -f2 | batch create 2>"$WORK/namespace.err"
  cat -- "$WORK/namespace.err" >&2
  sed -n 's/.*namespaces "team-\([^"]*\)" already exists.*/\1/p' "$WORK/namespace.err" |
    while read -r name; do
      printf '%s\tNamespaceNotOurs\t%s\n' "$name" "namespace team-$name already exists and is not managed by cnpa-op (no $LABEL=$name label); not adopting or modifying it - delete or rename it"
    done
}

# quota: create team-quota, or set its limits back to exactly the TeamSpace's spec. A reverted
# edit is logged and recorded as a Normal Event, so whoever edited the quota can learn why it
# came back; a change that follows the TeamSpace's spec is only logged.
quota() {
  local op=$1 name uid revert msg
  if [[ $op == create ]]; then
    cut -f2 | batch create
    return
  fi
  tee "$WORK/quota.rows" | cut -f2 | batch replace | tee "$WORK/quota.done"
  awk -F'\t' 'FILENAME == ARGV[1] { done[$1] = 1; next } ($1 in done) { print $1 "\t" $4 "\t" $3 }' \
      "$WORK/quota.done" "$WORK/quota.rows" |
    jq -rR 'split("\t") | [.[0], .[1], (.[2] | fromjson | .revert, .message)] | @tsv' |
    while IFS=$'\t' read -r name uid revert msg; do
      log "TeamSpace $name: $msg"
      if [[ $revert == true ]]; then
        event "$name" "$uid" Normal QuotaReverted "$msg"
      fi
    done
}

# status: observedGeneration and namespace, only through the status subresource (the main
# endpoint ignores .status). A replace carrying the resourceVersion that was read, or the one
# this pass's finalizer patch returned: if anybody changed the TeamSpace since, it fails and the
# next pass retries, so a generation that was never reconciled is never recorded.
status() {
  cut -f2 | jq -c --rawfile versions "$WORK/versions" '
      ($versions | split("\n") | map(split("\t") | select(length == 3) | {key: .[0], value: .[2]})
       | from_entries) as $rv
      | .metadata.resourceVersion = ($rv[.metadata.name] // .metadata.resourceVersion)' |
    batch replace --subresource=status
}

main() {
  local step fn op name uid reason msg rc=0
  WORK=$(mktemp -d) || { log "cannot create a temporary directory; pass aborted"; return 2; }
  trap 'rm -rf -- "$WORK"' EXIT
  : >"$WORK/versions"
  : >"$WORK/failed"
  : >"$WORK/events"
  # Three list requests per pass, whatever the number of TeamSpaces, at the same time.
  k get "$TEAMSPACES" -o json >"$WORK/teamspaces" 2>"$WORK/teamspaces.err" &
  local ts=$!
  k get namespaces -l "$LABEL" -o json >"$WORK/namespaces" 2>"$WORK/namespaces.err" &
  local nss=$!
  k get resourcequotas --all-namespaces --field-selector "metadata.name=$QUOTA" -o json \
    >"$WORK/quotas" 2>"$WORK/quotas.err" &
  local quotas=$!
  wait "$ts" || rc=2
  wait "$nss" || rc=2
  wait "$quotas" || rc=2
  if ((rc)); then
    cat -- "$WORK"/*.err >&2
    log "cannot list TeamSpaces, namespaces or quotas (API server unreachable or CRD missing?); pass aborted, nothing written"
    return 2
  fi
  jq -nr --arg F "$FINALIZER" --arg L "$LABEL" --arg G "$GROUP" --arg Q "$QUOTA" "$PLAN" \
     "$WORK/teamspaces" "$WORK/namespaces" "$WORK/quotas" >"$WORK/plan"
  for step in $STEPS; do
    fn=${step%:*} op=${step#*:}
    awk -F'\t' -v fn="$fn" -v op="$op" 'FILENAME == ARGV[1] { failed[$1] = 1; next }
        $2 == fn && $3 == op && !($1 in failed) { print $1 "\t" $4 "\t" $5 "\t" $6 }' \
        "$WORK/failed" "$WORK/plan" >"$WORK/rows"
    [[ -s $WORK/rows ]] || continue
    "$fn" "$op" <"$WORK/rows" >"$WORK/done" 2>"$WORK/err" || true
    cat -- "$WORK/err" >&2
    # Rows the step did not report written have failed: with the step's own reason and message,
    # or else with kubectl's last error line that names the object (kubectl quotes names), or
    # else its last line that names none (a patch's 422 names nothing).
    while IFS=$'\t' read -r name uid reason msg; do
      printf '%s\n' "$name" >>"$WORK/failed"
      rc=1
      if [[ $reason != - ]]; then
        log "TeamSpace $name: $msg"
      else
        log "TeamSpace $name: $fn $op failed; retrying on the next pass"
        reason="${fn^}${op^}Failed" msg=${msg:-$fn $op failed}
      fi
      is_conflict "$msg" || event "$name" "$uid" Warning "$reason" "$msg"
    done < <(awk -F'\t' '
        FILENAME == ARGV[1] { done[$1] = $2 "\t" $3; next }
        FILENAME == ARGV[2] { err[++n] = $0; if (index($0, "\"") == 0) anon = $0; next }
        ($1 in done) && done[$1] ~ /^ok\t/ { next }
        ($1 in done) { print $1 "\t" $4 "\t" done[$1]; next }
        { msg = anon
          for (i = n; i > 0; i--)
            if (index(err[i], "\"" $1 "\"") || index(err[i], "team-" $1 "\"") || index(err[i], "team-" $1 " ")) {
              msg = err[i]
              break
            }
          print $1 "\t" $4 "\t-\t" msg }' "$WORK/done" "$WORK/err" "$WORK/rows")
  done
  events
  return "$rc"
}

main "$@"
