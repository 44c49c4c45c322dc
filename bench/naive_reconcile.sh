#!/usr/bin/env bash
# naive_reconcile.sh - the benchmark's baseline, NOT the project's controller.
#
# The same job as reconcile.sh (namespace, quota, status, finalizer for every TeamSpace), done the
# way a first attempt usually does it: list the names, then for each TeamSpace get it and apply
# each object separately, one kubectl process per object, every pass. `kubectl apply` writes
# nothing when the object is unchanged, so an idle pass is write-free too; what grows with the
# number of TeamSpaces is the number of requests and processes. bench/run.py runs it in a unit
# that mirrors cnpa-op.service (loop, sleep 3).
set -uo pipefail

KUBECTL="${KUBECTL:-kubectl}"
ARCHIVE_DIR="${CNPA_ARCHIVE_DIR:-/root/cnpa-op/archive}"
TS=teamspaces.platform.labhub.io
FIN=platform.labhub.io/cleanup
LABEL=platform.labhub.io/teamspace

k() { "$KUBECTL" --request-timeout=10s "$@"; }

names=$(k get "$TS" -o jsonpath='{.items[*].metadata.name}') || exit 2
for name in $names; do
  ts=$(k get "$TS" "$name" -o json) || continue
  uid=$(jq -r .metadata.uid <<<"$ts")
  if [[ $(jq -r '.metadata.deletionTimestamp // ""' <<<"$ts") != "" ]]; then
    idx=$(jq --arg f "$FIN" '(.metadata.finalizers // []) | index($f) // empty' <<<"$ts")
    [[ -n $idx ]] || continue
    mkdir -p "$ARCHIVE_DIR"
    jq '{name: .metadata.name, uid: .metadata.uid, pods: .spec.pods}' <<<"$ts" \
      >"$ARCHIVE_DIR/.$name.tmp" && mv -f "$ARCHIVE_DIR/.$name.tmp" "$ARCHIVE_DIR/$name.json" &&
      k patch "$TS" "$name" --type json \
        -p "[{\"op\":\"test\",\"path\":\"/metadata/finalizers/$idx\",\"value\":\"$FIN\"},{\"op\":\"remove\",\"path\":\"/metadata/finalizers/$idx\"}]"
    continue
  fi
  if ! jq -e --arg f "$FIN" '(.metadata.finalizers // []) | index($f)' <<<"$ts" >/dev/null; then
    rv=$(jq -r .metadata.resourceVersion <<<"$ts")
    if jq -e '.metadata.finalizers == null' <<<"$ts" >/dev/null; then
      add="{\"op\":\"add\",\"path\":\"/metadata/finalizers\",\"value\":[\"$FIN\"]}"
    else
      add="{\"op\":\"add\",\"path\":\"/metadata/finalizers/-\",\"value\":\"$FIN\"}"
    fi
    k patch "$TS" "$name" --type json \
      -p "[{\"op\":\"test\",\"path\":\"/metadata/resourceVersion\",\"value\":\"$rv\"},$add]" || continue
  fi
  pods=$(jq -r .spec.pods <<<"$ts")
  cpu=$(jq -r '.spec.cpu // "1"' <<<"$ts")
  gen=$(jq -r .metadata.generation <<<"$ts")
  k apply -f - <<YAML || continue
apiVersion: v1
kind: Namespace
metadata:
  name: team-$name
  labels: {$LABEL: "$name"}
  ownerReferences:
  - {apiVersion: platform.labhub.io/v1alpha1, kind: TeamSpace, name: "$name", uid: "$uid",
     controller: true, blockOwnerDeletion: true}
YAML
  k apply -f - <<YAML || continue
apiVersion: v1
kind: ResourceQuota
metadata: {name: team-quota, namespace: team-$name, labels: {$LABEL: "$name"}}
spec:
  hard: {pods: "$pods", requests.cpu: "$cpu"}
YAML
  if [[ $(jq -r '.status.observedGeneration // ""' <<<"$ts") != "$gen" ]]; then
    k patch "$TS" "$name" --subresource=status --type merge \
      -p "{\"status\":{\"observedGeneration\":$gen,\"namespace\":\"team-$name\"}}"
  fi
done
