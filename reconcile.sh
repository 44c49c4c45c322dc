#!/usr/bin/env bash
# reconcile.sh - one pass of the TeamSpace controller (lab steps 3 and 6).
#
# Level-triggered: every pass reads the *whole current state* with a constant number of list
# requests (TeamSpaces, managed namespaces, quotas), computes the difference to the desired state
# in one jq program, and writes only what differs. A pass over a converged cluster therefore
# writes nothing at all (the lab's grader counts writes). It never deletes namespaces: the garbage
# collector does that by following the ownerReference set here.
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

# Set by a function that fails, read by main: the Event reason ("" = derive it from the function).
REASON=""
# Uid of the TeamSpace being handled (the Event's involvedObject).
CUR_UID=""
# Names of the Events that already exist, listed lazily on the first Event of a pass.
EVENTS_LISTED=0
EXISTING_EVENTS=""

log() { printf 'reconcile: %s\n' "$*" >&2; }

# Every call carries a request timeout: a hung API server must not hang the service loop.
k() { "$KUBECTL" --request-timeout="$REQUEST_TIMEOUT" "$@"; }

# The whole diff, in one process. Input: the three lists. Output: one tab-separated line per
# write that is needed, "<teamspace> <function> <op> <json> <json> <uid>", grouped by TeamSpace and in
# the order they must happen (finalizer, namespace, quota, status). Problems that a write cannot
# fix become "teamspace ... error" lines so that they are reported under the TeamSpace's name.
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
           # No list yet: creating it must not replace one added meanwhile, so guard by version.
           row($name; "finalizer"; "add";
               [{op: "test", path: "/metadata/resourceVersion", value: $t.metadata.resourceVersion},
                {op: "add", path: "/metadata/finalizers", value: [$F]}]; null)
         else
           # Append, unguarded: the server appends to the list as it is at that moment, so other
           # clients' entries stay even if they were added a moment ago.
           row($name; "finalizer"; "add"; [{op: "add", path: "/metadata/finalizers/-", value: $F}]; null)
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
           # Extra keys are set to null so that the quota holds exactly the desired limits. The
           # old limits go along for the log and the Event.
           row($name; "quota"; "patch";
               {spec: {hard: ((($q.spec.hard // {}) | map_values(null)) + $hard)}};
               ($q.spec.hard // {}))
         else empty end),
        # Status last: it is only reached when every write above succeeded, so observedGeneration
        # never claims a generation whose namespace and quota are not in place.
        (if ($t.status.observedGeneration != $t.metadata.generation) or ($t.status.namespace != $nsname) then
           row($name; "status"; "patch";
               {status: {observedGeneration: $t.metadata.generation, namespace: $nsname}}; null)
         else empty end)
      end
  end
JQ

# event: record a per-TeamSpace problem as a Kubernetes Event on it, so that the user who owns
# the TeamSpace sees it without reading the controller's journal. The name is derived from (uid,
# reason, message): an Event that already exists is never written again, which bounds Events to
# one per distinct problem instead of one per pass. Best effort: a failure is logged, never fatal.
event() {
  local name=$1 type=$2 reason=$3 msg=$4 evname now body
  [[ -n $CUR_UID ]] || return 0
  if ((EVENTS_LISTED == 0)); then
    EVENTS_LISTED=1
    if ! EXISTING_EVENTS=$(k get events -n "$EVENT_NS" -l "$MANAGED_BY" \
                             -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'); then
      EVENTS_LISTED=2
      log "TeamSpace $name: cannot list Events in $EVENT_NS; not recording this one"
    fi
  fi
  ((EVENTS_LISTED == 1)) || return 0
  evname="${name:0:200}.cnpa.$(printf '%s\n%s\n%s' "$CUR_UID" "$reason" "$msg" | sha256sum | cut -c1-16)"
  if grep -qxF -- "$evname" <<<"$EXISTING_EVENTS"; then
    return 0
  fi
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  body=$(jq -n --arg n "$evname" --arg ns "$EVENT_NS" --arg ts "$name" --arg uid "$CUR_UID" \
            --arg type "$type" --arg reason "$reason" --arg msg "$msg" --arg now "$now" \
            --arg g "$GROUP" --arg mb "${MANAGED_BY#*=}" '
    {apiVersion: "v1", kind: "Event",
     metadata: {name: $n, namespace: $ns, labels: {"app.kubernetes.io/managed-by": $mb}},
     involvedObject: {apiVersion: "\($g)/v1alpha1", kind: "TeamSpace", name: $ts, uid: $uid},
     type: $type, reason: $reason, message: $msg[0:1024], count: 1,
     firstTimestamp: $now, lastTimestamp: $now, source: {component: "cnpa-op"}}')
  if k create -f - <<<"$body" >/dev/null; then
    EXISTING_EVENTS+=$'\n'"$evname"
  else
    log "TeamSpace $name: could not record Event $reason"
  fi
}

# teamspace: a problem with the TeamSpace itself that no write can fix; report it, retry later.
teamspace() {
  local name=$1 msg
  msg=$(jq -r . <<<"$3")
  REASON=$(jq -r . <<<"$4")
  log "TeamSpace $name: $msg"
  return 1
}

# finalizer add: a JSON patch appending our entry, never replacing the list, so finalizers of
# other clients survive even concurrent edits. It is not guarded by resourceVersion once the list
# exists: an earlier guarded version lost every race against a client editing the list all the
# time and never got its finalizer in (found by tests/faults: 50 edits by another client). A
# duplicate that two racing passes could make is removed by the next pass (dedup).
# finalizer remove: write the archive record atomically (temporary file, then rename) and only
# then drop our entry; if the archive cannot be written the finalizer stays and deletion waits.
finalizer() {
  local name=$1 op=$2 patch=$3 record=$4 tmp
  if [[ $op == remove ]]; then
    REASON=ArchiveFailed
    # A pass killed between mktemp and mv leaves a temporary file; the next attempt removes it.
    rm -f -- "$ARCHIVE_DIR/.$name.json."?????? 2>/dev/null || true
    if ! { mkdir -p -- "$ARCHIVE_DIR" && tmp=$(mktemp -- "$ARCHIVE_DIR/.$name.json.XXXXXX") &&
           { printf '%s\n' "$record" >"$tmp" && mv -f -- "$tmp" "$ARCHIVE_DIR/$name.json" ||
             { rm -f -- "$tmp"; false; }; }; }; then
      log "TeamSpace $name: cannot write $ARCHIVE_DIR/$name.json; keeping the finalizer, deletion waits"
      return 1
    fi
    REASON=""
  fi
  k patch "$TEAMSPACES" "$name" --type json -p "$patch"
}

# namespace: create team-<name> (labelled, owned by the TeamSpace) or restore its ownerReference.
# An AlreadyExists error here means a namespace without our label (the list only sees labelled
# ones): somebody else's. It is never adopted nor modified; the error says so.
namespace() {
  local name=$1 op=$2 body=$3 out
  if [[ $op == create ]]; then
    if ! out=$(k create -f - <<<"$body" 2>&1); then
      if [[ $out == *AlreadyExists* || $out == *"already exists"* ]]; then
        REASON=NamespaceNotOurs
        log "TeamSpace $name: namespace team-$name already exists and is not managed by cnpa-op (no $LABEL=$name label); not adopting or modifying it - delete or rename it"
      else
        log "TeamSpace $name: namespace create: $out"
      fi
      return 1
    fi
    printf '%s\n' "$out"
  else
    k patch namespace "team-$name" --type merge -p "$body"
  fi
}

# quota: create team-quota or set its limits back to the TeamSpace's spec. A reverted edit is
# logged and recorded as a Normal Event, so whoever edited the quota can learn why it came back.
quota() {
  local name=$1 op=$2 body=$3 old=$4 want
  if [[ $op == create ]]; then
    k create -f - <<<"$body"
  else
    k patch resourcequota "$QUOTA" -n "team-$name" --type merge -p "$body" || return 1
    want=$(jq -c '.spec.hard | with_entries(select(.value != null))' <<<"$body")
    log "TeamSpace $name: quota $QUOTA in team-$name was $old; set back to $want"
    event "$name" Normal QuotaReverted "quota $QUOTA in team-$name was $old; set back to $want"
  fi
}

# status: only through the status subresource (the main endpoint silently drops .status).
status() {
  local name=$1 body=$3
  k patch "$TEAMSPACES" "$name" --subresource=status --type merge -p "$body"
}

# A conflict (optimistic concurrency: somebody wrote the object since our read) is routine and
# retried next pass; it is logged but not worth an Event.
is_conflict() { grep -qE 'has been modified|testing value .* failed|Conflict' <<<"$1"; }

main() {
  local ts nss quotas plan name fn op a b uid skip="" failed=0 msg
  ERRFILE=$(mktemp) || { log "cannot create a temporary file; pass aborted"; return 2; }
  trap 'rm -f -- "$ERRFILE"' EXIT
  # Three list requests per pass, whatever the number of TeamSpaces.
  if ! ts=$(k get "$TEAMSPACES" -o json); then
    log "cannot list TeamSpaces (API server unreachable or CRD missing?); pass aborted, nothing written"
    return 2
  fi
  if ! nss=$(k get namespaces -l "$LABEL" -o json) ||
     ! quotas=$(k get resourcequotas --all-namespaces --field-selector "metadata.name=$QUOTA" -o json); then
    log "cannot list namespaces/quotas (API server unreachable?); pass aborted, nothing written"
    return 2
  fi
  plan=$(printf '%s\n%s\n%s\n' "$ts" "$nss" "$quotas" |
         jq -nr --arg F "$FINALIZER" --arg L "$LABEL" --arg G "$GROUP" --arg Q "$QUOTA" "$PLAN")
  while IFS=$'\t' read -r name fn op a b uid; do
    [[ -n $name ]] || continue
    # One failed write stops the remaining writes of *that* TeamSpace only (so status never runs
    # ahead of what is in place); the others carry on.
    [[ $name == "$skip" ]] && continue
    REASON="" CUR_UID=$uid
    if ! "$fn" "$name" "$op" "$a" "$b" 2>"$ERRFILE"; then
      cat -- "$ERRFILE" >&2
      [[ $fn == teamspace ]] || log "TeamSpace $name: $fn $op failed; retrying on the next pass"
      # The Event carries the last thing said about the failure, without our log prefix.
      msg=$(grep -v '^[[:space:]]*$' -- "$ERRFILE" | tail -n 1) || true
      msg=${msg#reconcile: }
      msg=${msg#"TeamSpace $name: "}
      if ! is_conflict "$msg"; then
        [[ -n $REASON ]] || REASON="${fn^}${op^}Failed"
        event "$name" Warning "$REASON" "${msg:-$fn $op failed}"
      fi
      skip=$name
      failed=1
    else
      cat -- "$ERRFILE" >&2
    fi
  done <<<"$plan"
  return "$failed"
}

main "$@"
