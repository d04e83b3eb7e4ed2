#!/bin/bash
# Checks by hand against a real kube-apiserver v1.28.0 (+ etcd), all inside a network
# namespace of its own (the agent's socket hooks in a cgroup of its own):
#   events      the agent's Events on a Service a full map leaves out (RBAC as deploy/)
#   scale       N Services (default 10,000) × 2 endpoints: the agent's start to its first
#               sync and its RSS, then kube-proxy's first sync, each alone
#   kube-proxy  kube-proxy v1.28.0's live iptables rules beside `xlb emit iptables` of the
#               same objects (docs/real-apiserver-services.yaml), and `xlb agent --shadow`
# Usage: KUBE_APISERVER=path XLB=path [KUBE_PROXY=path] [WORK=dir] docs/real-apiserver.sh CHECK
# (as root; etcd, curl, jq, openssl, iptables and python3-yaml on PATH). Prints what it
# sees; read it. docs/testing.md says how the binaries are built.
set -u
: "${KUBE_APISERVER:?path of a kube-apiserver binary}" "${XLB:?path of the xlb binary}"
CHECK=${1:?events or kube-proxy}
DOCS=$(dirname "$0"); RBAC=$DOCS/../deploy/base/rbac.yaml
K=${WORK:-/tmp/xlb-real-apiserver}; R=$K/run; NS=xkreal$$; CG=/sys/fs/cgroup/unified/xkreal$$; PINS=/sys/fs/bpf/xkreal$$
rm -rf $R && mkdir -p $R/etcd $R/certs
cleanup() {
  for p in ${AGENT:-} ${PROXY:-}; do kill $p 2>/dev/null; done; sleep 1
  for p in ${APISERVER:-} ${ETCD:-}; do kill $p 2>/dev/null; done
  sleep 2; ip netns del ${NS}e 2>/dev/null; ip netns pids $NS 2>/dev/null | xargs -r kill -9
  ip netns del $NS 2>/dev/null; rm -rf $PINS; rmdir $CG 2>/dev/null; true
}
trap cleanup EXIT
ip netns add $NS && ip -n $NS link set lo up && ip -n $NS link add xkd0 type veth peer name xkd1 && ip -n $NS link set xkd1 up \
  && ip -n $NS addr add 10.0.0.1/24 dev xkd0 && ip -n $NS link set xkd0 up
mkdir -p $CG
X="nsenter --net=/run/netns/$NS"
openssl genrsa -out $R/sa.key 2048 2>/dev/null
ADMIN=admintoken$$; XLBT=xlbtoken$$
printf '%s,admin,admin,system:masters\n%s,system:serviceaccount:kube-system:xlb,xlb-uid,system:serviceaccounts\n' $ADMIN $XLBT > $R/tokens.csv
$X etcd --data-dir $R/etcd --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 > $R/etcd.log 2>&1 & ETCD=$!
sleep 3
$X $KUBE_APISERVER --etcd-servers http://127.0.0.1:2379 --bind-address 10.0.0.1 --advertise-address 10.0.0.1 \
  --secure-port 6443 --cert-dir $R/certs --token-auth-file $R/tokens.csv --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file $R/sa.key \
  --service-account-signing-key-file $R/sa.key --service-cluster-ip-range 10.96.0.0/16 > $R/apiserver.log 2>&1 & APISERVER=$!
API=https://10.0.0.1:6443
k() { $X curl -sk -H "Authorization: Bearer $ADMIN" "$@"; }
for i in $(seq 60); do [ "$(k $API/readyz)" = ok ] && break; sleep 1; done
echo "readyz: $(k $API/readyz)"; k $API/version | jq -c '{gitVersion}'
apply() { # kind-path name json
  k -X POST -H 'Content-Type: application/yaml' --data-binary @"$2" "$API$1" | jq -c '{kind, name: .metadata.name, reason, message}'; }
kubeconfig() { # user token: $R/kubeconfig, the server's certificate not checked
  printf '%s\n' "apiVersion: v1" "kind: Config" \
    "clusters: [{name: real, cluster: {server: \"$API\", insecure-skip-tls-verify: true}}]" \
    "users: [{name: $1, user: {token: \"$2\"}}]" \
    "contexts: [{name: real, context: {cluster: real, user: $1}}]" "current-context: real" > $R/kubeconfig; }
check_events() {
# RBAC exactly as deploy/base/rbac.yaml (ServiceAccount, ClusterRole, ClusterRoleBinding).
python3 - "$K" "$RBAC" <<'PY'
import sys, yaml, json, os
docs = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
for i, d in enumerate(docs): json.dump(d, open(f"{sys.argv[1]}/run/rbac{i}.json", "w"))
PY
apply /api/v1/namespaces/kube-system/serviceaccounts $R/rbac0.json
apply /apis/rbac.authorization.k8s.io/v1/clusterroles $R/rbac1.json
apply /apis/rbac.authorization.k8s.io/v1/clusterrolebindings $R/rbac2.json
echo '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"test"}}' > $R/ns.json; apply /api/v1/namespaces $R/ns.json
echo '{"apiVersion":"v1","kind":"Node","metadata":{"name":"node1"}}' > $R/node.json; apply /api/v1/nodes $R/node.json
svc() { echo "{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{\"name\":\"$1\",\"namespace\":\"test\"},\"spec\":{\"clusterIP\":\"$2\",\"ports\":[{\"name\":\"http\",\"port\":80,\"protocol\":\"TCP\"}]}}" > $R/svc-$1.json; apply /api/v1/namespaces/test/services $R/svc-$1.json; }
eps() { echo "{\"apiVersion\":\"discovery.k8s.io/v1\",\"kind\":\"EndpointSlice\",\"metadata\":{\"name\":\"$1-a\",\"namespace\":\"test\",\"labels\":{\"kubernetes.io/service-name\":\"$1\"}},\"addressType\":\"IPv4\",\"ports\":[{\"name\":\"http\",\"port\":8080,\"protocol\":\"TCP\"}],\"endpoints\":[{\"addresses\":[\"10.244.1.2\"],\"conditions\":{\"ready\":true}},{\"addresses\":[\"10.244.1.3\"],\"conditions\":{\"ready\":true}}]}" > $R/eps-$1.json; apply /apis/discovery.k8s.io/v1/namespaces/test/endpointslices $R/eps-$1.json; }
kubeconfig xlb $XLBT
svc web 10.96.0.10; eps web
$X $XLB agent --source kubernetes --kubeconfig $R/kubeconfig --hostname-override node1 --pod-interfaces 'xkp-*' \
  --node-interfaces xkd0 --service-map-max 6 --bpffs $PINS --cgroup-path $CG > $R/agent.log 2>&1 & AGENT=$!
events() { k "$API/apis/events.k8s.io/v1/namespaces/test/events" | jq -c '.items | sort_by(.eventTime)[] | {type, reason, note, regarding: .regarding.name, uid: (.regarding.uid != null), series: .series.count, reportingController, reportingInstance, action}'; }
sleep 8; echo "== services in the API"; k $API/api/v1/services | jq -c '.items[] | {ns: .metadata.namespace, name: .metadata.name, ip: .spec.clusterIP}'; echo "== list after web"; $X $XLB list services --bpffs $PINS 2>&1 | head
svc api 10.96.0.11; eps api
sleep 8; echo "== events after api (map full expected)"; events
echo "== list"; $X $XLB list services --bpffs $PINS 2>&1 | head
echo "== kubectl-style view (core/v1 events)"; k "$API/api/v1/namespaces/test/events" | jq -c '.items[] | {type, reason, message, count, obj: .involvedObject.name, source}'
# A change to api's endpoints while it still fails (a third endpoint: it needs 4 entries now): no second Event.
sed 's/api-a/api-b/; s/10.244.1.2/10.244.1.4/; s/,{"addresses":\["10.244.1.3"\],"conditions":{"ready":true}}//' $R/eps-api.json > $R/eps-api-b.json
apply /apis/discovery.k8s.io/v1/namespaces/test/endpointslices $R/eps-api-b.json
sleep 8; echo "== events after a change while failing (still one)"; events
k -X DELETE "$API/api/v1/namespaces/test/services/web" | jq -c .status
sleep 8; echo "== events after web deleted (recovered expected)"; events
echo "== list"; $X $XLB list services --bpffs $PINS 2>&1 | head
# Failing the same way again within the de-duplication window: the first Event's series (count 2).
sed 's/api-b/api-c/; s/10.244.1.4/10.244.1.5/' $R/eps-api-b.json > $R/eps-api-c.json
apply /apis/discovery.k8s.io/v1/namespaces/test/endpointslices $R/eps-api-c.json
sleep 8; echo "== events after api fails again (series 2 expected)"; events
echo "== list (api keeps the 3 backends that fit)"; $X $XLB list services --bpffs $PINS 2>&1 | head
echo "== agent log (events)"; grep -i -E "event|mapfull|full" $R/agent.log | head -20
echo "== apiserver audit of denials"; grep -i forbidden $R/apiserver.log | head -5
}
check_scale() { # N Services × 2 endpoints (N=${N:-10000}): the agent, then kube-proxy, each alone
  : "${KUBE_PROXY:?path of a kube-proxy binary}"
  local n=${N:-10000}
  kubeconfig admin $ADMIN
  echo '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"test"}}' > $R/ns.json; apply /api/v1/namespaces $R/ns.json
  echo '{"apiVersion":"v1","kind":"Node","metadata":{"name":"node1"}}' > $R/node.json; apply /api/v1/nodes $R/node.json
  local t0=$(date +%s.%N)
  $X python3 - "$n" "$ADMIN" <<'PY2'
import sys, json, ssl, http.client
n, token = int(sys.argv[1]), sys.argv[2]
ctx = ssl._create_unverified_context()
c = http.client.HTTPSConnection("10.0.0.1", 6443, context=ctx)
h = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
def post(path, obj):
    c.request("POST", path, json.dumps(obj), h)
    r = c.getresponse(); body = r.read()
    if r.status >= 300: sys.exit(f"{path}: {r.status} {body[:200]}")
for i in range(n):
    name = f"s{i}"
    post("/api/v1/namespaces/test/services", {"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {"ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
    a = f"10.{64 + i // 32768}.{(i // 128) % 256}.{(i % 128) * 2}"
    b = a.rsplit(".", 1)[0] + "." + str(int(a.rsplit(".", 1)[1]) + 1)
    post("/apis/discovery.k8s.io/v1/namespaces/test/endpointslices", {"apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice", "metadata": {"name": name + "-a", "namespace": "test",
        "labels": {"kubernetes.io/service-name": name}}, "addressType": "IPv4",
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}}, {"addresses": [b], "conditions": {"ready": True}}]})
PY2
  echo "created $n Services and their slices in $(echo "$(date +%s.%N) - $t0" | bc) s"
  # The agent alone: from start to its first full sync, and its RSS once settled.
  t0=$(date +%s.%N)
  $X $XLB agent --source kubernetes --kubeconfig $R/kubeconfig --hostname-override node1 --pod-interfaces 'xkp-*' \
    --node-interfaces xkd0 --bpffs $PINS --cgroup-path $CG > $R/agent.log 2>&1 & AGENT=$!
  for i in $(seq 600); do grep -q "synced services=" $R/agent.log && break; sleep 0.1; done
  echo "xlb agent: start -> first sync $(echo "$(date +%s.%N) - $t0" | bc) s (polled every 0.1 s)"
  grep -m1 "synced services=" $R/agent.log | sed 's/^[^ ]* *//'
  sleep 5; echo "xlb agent VmRSS: $(grep VmRSS /proc/$AGENT/status)"
  kill $AGENT; wait $AGENT 2>/dev/null; AGENT=
  $X $XLB cleanup --bpffs $PINS --cgroup-path $CG > /dev/null 2>&1
  # kube-proxy alone (iptables mode): its first full sync as it logs it.
  $X $KUBE_PROXY --kubeconfig $R/kubeconfig --hostname-override node1 --proxy-mode iptables --cluster-cidr 10.244.0.0/16 \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
    --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 --v 2 > $R/kube-proxy.log 2>&1 & PROXY=$!
  for i in $(seq 1200); do grep -qs "SyncProxyRules complete" $R/kube-proxy.log && break; sleep 0.5; done
  echo "kube-proxy:"; grep -E "SyncProxyRules complete|Syncing iptables rules|Reloading service iptables" $R/kube-proxy.log | head -4
  sleep 3; echo "kube-proxy VmRSS: $(grep VmRSS /proc/$PROXY/status)"
}
check_kube_proxy() {
  : "${KUBE_PROXY:?path of a kube-proxy binary}"
kubeconfig admin $ADMIN
post() { k -X POST -H 'Content-Type: application/json' --data-binary @"$2" "$API$1" | jq -r '"\(.kind) \(.metadata.name // .message)"'; }
echo '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"test"}}' > $R/ns.json; post /api/v1/namespaces $R/ns.json
echo '{"apiVersion":"v1","kind":"Node","metadata":{"name":"node1"}}' > $R/node.json; post /api/v1/nodes $R/node.json
k -X PATCH -H 'Content-Type: application/merge-patch+json' --data '{"status":{"addresses":[{"type":"InternalIP","address":"10.0.0.1"}]}}' $API/api/v1/nodes/node1/status | jq -c .status.addresses
python3 - "$DOCS/real-apiserver-services.yaml" "$R" <<'PY'
import sys, yaml, json
for i, d in enumerate(x for x in yaml.safe_load_all(open(sys.argv[1])) if x):
    json.dump(d, open(f"{sys.argv[2]}/obj{i:02}.json", "w"))
PY
for f in $R/obj*.json; do
  kind=$(jq -r .kind $f); ns=$(jq -r .metadata.namespace $f); name=$(jq -r .metadata.name $f)
  case $kind in
    Service) post /api/v1/namespaces/$ns/services $f
      if [ "$(jq -r '.status.loadBalancer.ingress // empty' $f)" != "" ]; then
        jq '{status}' $f > $f.status
        k -X PATCH -H 'Content-Type: application/merge-patch+json' --data-binary @$f.status $API/api/v1/namespaces/$ns/services/$name/status | jq -c .status
      fi;;
    EndpointSlice) post /apis/discovery.k8s.io/v1/namespaces/$ns/endpointslices $f;;
  esac
done
$X $KUBE_PROXY --kubeconfig $R/kubeconfig --hostname-override node1 --proxy-mode iptables --cluster-cidr 10.244.0.0/16 \
  --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0 \
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 --v 2 > $R/kube-proxy.log 2>&1 & PROXY=$!
sleep 8
$X iptables-save > $R/live.txt
# The objects as the server holds them (defaults filled in), for xlb emit's file source.
k $API/api/v1/services | jq -c '.items[] | . + {apiVersion: "v1", kind: "Service"}' > $R/input.jsonl
k $API/apis/discovery.k8s.io/v1/endpointslices | jq -c '.items[] | . + {apiVersion: "discovery.k8s.io/v1", kind: "EndpointSlice"}' >> $R/input.jsonl
sed 's/^/---\n/' $R/input.jsonl > $R/input.yaml
$XLB emit iptables --source file:$R/input.yaml --node-name node1 --node-ip 10.0.0.1 --local-address 10.0.0.1 --cluster-cidr 10.244.0.0/16 > $R/emitted.txt 2> $R/emit.err
echo "emit rc=$? $(wc -l < $R/emitted.txt) lines; live $(wc -l < $R/live.txt) lines"
# The emitted rules through iptables-restore and iptables-save in a namespace of their own, so
# both sides are in iptables-save's canonical form; kube-proxy's chains only (its jumps from
# the built-in chains are inserted by hand, not restored).
ip netns add ${NS}e
ip netns exec ${NS}e iptables-restore < $R/emitted.txt && ip netns exec ${NS}e iptables-save > $R/emitted.save
ip netns del ${NS}e
norm() { grep -E '^(-A KUBE-|:KUBE-)' "$1" | sed -E 's/ \[[0-9]+:[0-9]+\]$//' | sort; }
norm $R/live.txt > $R/live.norm; norm $R/emitted.save > $R/emitted.norm
echo "rules compared: live $(wc -l < $R/live.norm), emitted $(wc -l < $R/emitted.norm)"
echo "== only in kube-proxy's live rules"; comm -23 $R/live.norm $R/emitted.norm
echo "== only in xlb emit"; comm -13 $R/live.norm $R/emitted.norm
mkdir -p /run/xlb
$X $XLB agent --shadow --source kubernetes --kubeconfig $R/kubeconfig --hostname-override node1 --shadow-interval 2 --shadow-grace 2 \
   --shadow-report $R/shadow.json --node-interfaces xkd0 --healthz-bind-address 127.0.0.1:20256 --metrics-bind-address 127.0.0.1:20249 > $R/shadow.log 2>&1 & AGENT=$!
sleep 12
echo "== xlb shadow report"; $X $XLB shadow report --file $R/shadow.json 2>&1 | head -60
}
case $CHECK in
  events) check_events;;
  kube-proxy) check_kube_proxy;;
  scale) check_scale;;
  *) echo "unknown check $CHECK" >&2; exit 2;;
esac
