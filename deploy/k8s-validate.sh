#!/usr/bin/env bash
# Validate the Kubernetes manifests under k8s/ offline, without a cluster.
#
#   deploy/k8s-validate.sh            # from anywhere in the repository
#
# 1. Installs the PyPI package kubernetes-validate (pinned) into a venv under
#    ${ENGRAM_LOCAL_DIR:-/var/tmp/engram-local}/tools/k8s-venv, once.
# 2. Renders every base kustomization.yaml by concatenating its resources
#    (recursively), and fails on a manifest no kustomization includes (other
#    than *.example.yaml). The base kustomizations are plain resource lists on
#    purpose, so this is exactly what kustomize renders; the script refuses any
#    other field there. Where kubectl is installed it also renders each one
#    with `kubectl kustomize` and checks that both renderings agree. Overlays
#    (k8s/overlays/*: patches, a namespace) are rendered with `kubectl
#    kustomize` only, so kubectl is required once there are overlays.
# 3. Cross-checks what a schema cannot see: selectors match pod labels, probe
#    and Service ports match container ports, referenced ConfigMaps exist, the
#    Secret keys used are those of k8s/base/secret.example.yaml, the grace
#    period covers the service's shutdown, the recommended labels are set;
#    custom resources (cert-manager's Certificate, the Prometheus Operator's
#    ServiceMonitor) have what those operators need; the dev overlay's
#    StatefulSets (Postgres, RabbitMQ: third-party images) run as non-root
#    without escalation, with resources, a readiness probe and their Service;
#    a Secret an overlay brings has the example's keys.
# 4. Runs `kubernetes-validate --strict` on every base manifest file and every
#    rendering (overlay patch files are only checked as part of their
#    rendering; the custom resources above have no schema here), for each
#    Kubernetes version in ENGRAM_K8S_VERSIONS. Any other unknown kind (no
#    schema) counts as a failure.
#
# Environment:
#   ENGRAM_LOCAL_DIR       machine-local tools and data (default /var/tmp/engram-local)
#   ENGRAM_K8S_VERSIONS    versions to validate against (default "1.37.0 1.30.0":
#                          the newest kubernetes-validate knows and the oldest
#                          the manifests support, for the preStop sleep action)
#   KUBECTL                kubectl to render with (default: kubectl on PATH);
#                          KUBECTL=none takes the no-kubectl path
#
# Exits non-zero on the first failing stage.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
local_dir=${ENGRAM_LOCAL_DIR:-/var/tmp/engram-local}
venv=$local_dir/tools/k8s-venv
kv_version=1.37.0
read -r -a k8s_versions <<< "${ENGRAM_K8S_VERSIONS:-1.37.0 1.30.0}"
k8s_dir=$repo_root/k8s
kubectl=${KUBECTL:-kubectl}

say() { printf '==> %s\n' "$*"; }
die() { printf 'k8s-validate: %s\n' "$*" >&2; exit 1; }

# --- 1. tools --------------------------------------------------------------
installed_version() {
    "$venv/bin/kubernetes-validate" --version 2>/dev/null || true
}
if [[ "$(installed_version)" != "$kv_version" ]]; then
    command -v python3 > /dev/null || die "python3 is required (apt-get install python3 python3-venv)"
    say "installing kubernetes-validate==$kv_version into $venv"
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv" \
        || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$kv_version"
    [[ "$(installed_version)" == "$kv_version" ]] || die "kubernetes-validate did not install"
fi
python=$venv/bin/python   # has PyYAML, a dependency of kubernetes-validate
say "kubernetes-validate $(installed_version) from $venv; Kubernetes ${k8s_versions[*]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/engram-k8s-validate.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/concat" "$work/kustomize"

# --- 2. render ---------------------------------------------------------------
# Prints one line per kustomization: "<dir relative to repo>\t<rendered file>".
"$python" - "$repo_root" "$k8s_dir" "$work/concat" > "$work/kustomizations.tsv" <<'PY'
import pathlib, sys, yaml

repo, k8s, out = (pathlib.Path(p) for p in sys.argv[1:4])
ALLOWED = {"apiVersion", "kind", "resources"}
OVERLAYS = k8s / "overlays"

def is_overlay(kdir: pathlib.Path) -> bool:
    return OVERLAYS in kdir.resolve().parents

def overlay_files(kdir: pathlib.Path) -> list[pathlib.Path]:
    """The files an overlay's kustomization names (resources and patches)."""
    k = yaml.safe_load((kdir / "kustomization.yaml").read_text()) or {}
    files = []
    for entry in k.get("resources") or []:
        target = (kdir / entry).resolve()
        if target.is_file():
            files.append(target)
        elif not target.is_dir():
            sys.exit(f"{kdir.relative_to(repo)}: resource {entry!r} does not exist")
    for patch in k.get("patches") or []:
        if "path" in patch:
            target = (kdir / patch["path"]).resolve()
            if not target.is_file():
                sys.exit(f"{kdir.relative_to(repo)}: patch {patch['path']!r} does not exist")
            files.append(target)
    return files

def resources_of(kdir: pathlib.Path, seen: tuple) -> list[pathlib.Path]:
    if kdir in seen:
        sys.exit(f"kustomization cycle through {kdir}")
    kfile = kdir / "kustomization.yaml"
    if not kfile.is_file():
        sys.exit(f"{kdir}: no kustomization.yaml")
    k = yaml.safe_load(kfile.read_text()) or {}
    extra = set(k) - ALLOWED
    if extra:
        sys.exit(f"{kfile.relative_to(repo)}: fields {sorted(extra)} are not rendered by concatenation; "
                 "keep base kustomizations to plain resource lists (use an overlay for the rest)")
    files = []
    for entry in k.get("resources") or []:
        target = (kdir / entry).resolve()
        if target.is_dir():
            files += resources_of(target, seen + (kdir,))
        elif target.is_file():
            files.append(target)
        else:
            sys.exit(f"{kfile.relative_to(repo)}: resource {entry!r} does not exist")
    return files

included = set()
for kfile in sorted(k8s.rglob("kustomization.yaml"), key=lambda p: p.parent.parts):
    kdir = kfile.parent
    rel = kdir.relative_to(repo)
    if is_overlay(kdir):
        # Rendered by kubectl kustomize below; listed with an empty rendering.
        included.update(overlay_files(kdir))
        print(f"{rel}\t-")
        continue
    files = resources_of(kdir, ())
    included.update(files)
    if len(set(files)) != len(files):
        sys.exit(f"{rel}: a resource file is included twice")
    target = out / (str(rel).replace("/", "__") + ".yaml")
    target.write_text("".join(f"---\n# Source: {f.relative_to(repo)}\n{f.read_text()}" for f in files))
    print(f"{rel}\t{target}")

# A manifest no kustomization includes would never be applied: only examples may be.
orphans = [f.relative_to(repo) for f in sorted(k8s.rglob("*.yaml"))
           if f.name != "kustomization.yaml" and not f.name.endswith(".example.yaml")
           and f.resolve() not in included]
if orphans:
    sys.exit(f"not included by any kustomization: {', '.join(map(str, orphans))}")
PY
while IFS=$'\t' read -r rel rendered; do
    [[ "$rendered" == - ]] && continue
    say "rendered $rel by concatenation ($(grep -c '^kind:' "$rendered") objects)"
done < "$work/kustomizations.tsv"

# Overlays: kubectl kustomize is the only renderer (patches, namespace).
: > "$work/overlays.tsv"
while IFS=$'\t' read -r rel rendered; do
    [[ "$rendered" == - ]] || continue
    [[ "$kubectl" != none ]] && command -v "$kubectl" > /dev/null \
        || die "$rel is an overlay: rendering it needs kubectl (kubectl kustomize)"
    overlay=$work/kustomize/$(echo "$rel" | tr / _).yaml
    "$kubectl" kustomize "$repo_root/$rel" > "$overlay" 2> "$work/kubectl.err" \
        || { cat "$work/kubectl.err" >&2; die "kubectl kustomize $rel failed"; }
    say "rendered overlay $rel with kubectl kustomize ($(grep -c '^kind:' "$overlay") objects)"
    printf '%s\t%s\n' "$rel" "$overlay" >> "$work/overlays.tsv"
done < "$work/kustomizations.tsv"
# From here on the listing holds every rendering: the bases' concatenations and the overlays.
grep -v $'\t-$' "$work/kustomizations.tsv" > "$work/bases.tsv" || true
cat "$work/bases.tsv" "$work/overlays.tsv" > "$work/kustomizations.tsv"

if [[ "$kubectl" != none ]] && command -v "$kubectl" > /dev/null; then
    while IFS=$'\t' read -r rel rendered; do
        kustomized=$work/kustomize/base-$(basename "$rendered")
        "$kubectl" kustomize "$repo_root/$rel" > "$kustomized" 2> "$work/kubectl.err" \
            || { cat "$work/kubectl.err" >&2; die "kubectl kustomize $rel failed"; }
        "$python" - "$rendered" "$kustomized" <<'PY' || die "$rel: kustomize and concatenation disagree"
import sys, yaml
def objects(path):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}
a, b = objects(sys.argv[1]), objects(sys.argv[2])
if a != b:
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            print(f"  differs: {key[0]}/{key[1]}", file=sys.stderr)
    sys.exit(1)
PY
        say "kubectl kustomize $rel matches the concatenation"
    done < "$work/bases.tsv"
else
    say "kubectl not installed: validating the concatenated renderings and the resource files"
fi

# --- 3. cross-checks ---------------------------------------------------------
"$python" - "$repo_root" "$k8s_dir" "$work/kustomizations.tsv" <<'PY'
import pathlib, sys, yaml

repo, k8s, listing = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
failures, checks = [], 0

def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)

secret_example = k8s / "base" / "secret.example.yaml"
secret_doc = yaml.safe_load(secret_example.read_text())
secret_name = secret_doc["metadata"]["name"]
secret_keys = set(secret_doc.get("stringData") or {}) | set(secret_doc.get("data") or {})

def check_workload(where, spec):
    """What holds for every workload: the selector matches the pods, which run as non-root."""
    pod_labels = spec["template"]["metadata"]["labels"]
    check(all(pod_labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()),
          f"{where}: selector does not match the pod labels")
    check(spec["template"]["spec"].get("securityContext", {}).get("runAsNonRoot") is True,
          f"{where}: pod runAsNonRoot")

def check_container(cw, c):
    """What holds for every container: no escalation, no capabilities, bounded resources."""
    sc = c.get("securityContext", {})
    check(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation")
    check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{cw}: capabilities drop ALL")
    check("requests" in c.get("resources", {}) and "limits" in c.get("resources", {}),
          f"{cw}: resources requests and limits")

for line in open(listing):
    rel, rendered = line.rstrip("\n").split("\t")
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    configmaps = by_kind.get("ConfigMap", {})
    deployments = by_kind.get("Deployment", {})
    # Secrets cert-manager writes (tls.crt, tls.key, ca.crt).
    certificate_secrets = {c["spec"]["secretName"] for c in by_kind.get("Certificate", {}).values()}
    for cname, cert in by_kind.get("Certificate", {}).items():
        where = f"{rel}: Certificate/{cname}"
        check(cert["spec"].get("issuerRef", {}).get("name"), f"{where}: no issuerRef")
        for sname in by_kind.get("Service", {}):
            check(sname in cert["spec"].get("dnsNames", []), f"{where}: dnsNames lacks Service {sname}")
    for mname, monitor in by_kind.get("ServiceMonitor", {}).items():
        where = f"{rel}: ServiceMonitor/{mname}"
        selector = monitor["spec"]["selector"]["matchLabels"]
        selected = [svc for svc in by_kind.get("Service", {}).values()
                    if all(svc["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        check(len(selected) == len(by_kind.get("Service", {})) > 0, f"{where}: does not select every Service")
        for endpoint in monitor["spec"]["endpoints"]:
            check(all(any(p.get("name") == endpoint["port"] for p in svc["spec"]["ports"]) for svc in selected),
                  f"{where}: port {endpoint['port']} is not a port of every Service")

    for d in docs:
        name = f"{rel}: {d['kind']}/{d['metadata']['name']}"
        labels = d["metadata"].get("labels") or {}
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/component"):
            check(key in labels, f"{name}: label {key} missing")
        check(labels.get("app.kubernetes.io/part-of") == "engram", f"{name}: part-of is not engram")

    for dname, dep in deployments.items():
        where = f"{rel}: Deployment/{dname}"
        spec = dep["spec"]
        pod = spec["template"]["spec"]
        check_workload(where, spec)
        containers = [(False, c) for c in pod.get("initContainers", [])] + [(True, c) for c in pod["containers"]]
        for is_main, c in containers:
            cw = f"{where} container {c['name']}"
            check_container(cw, c)
            check(c.get("securityContext", {}).get("readOnlyRootFilesystem") is True,
                  f"{cw}: readOnlyRootFilesystem")
            env = {}
            for ref in c.get("envFrom", []):
                cm = ref.get("configMapRef", {}).get("name")
                if cm:
                    check(cm in configmaps, f"{cw}: ConfigMap {cm} is not in {rel}")
                    env.update((configmaps.get(cm) or {}).get("data") or {})
                check("secretRef" not in ref, f"{cw}: use secretKeyRef per key, not secretRef")
            for e in c.get("env", []):
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    check(ref["name"] == secret_name and ref["key"] in secret_keys,
                          f"{cw}: secret {ref['name']}/{ref['key']} is not in {secret_example.name}")
            if is_main:
                ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
                check("grpc" in ports, f"{cw}: no container port named grpc")
                listen = env.get("ENGRAM_GRPC__LISTEN_ADDR", "")
                check(listen.rsplit(":", 1)[-1] == str(ports.get("grpc")),
                      f"{cw}: ENGRAM_GRPC__LISTEN_ADDR {listen!r} is not the grpc port")
                metrics_listen = env.get("ENGRAM_GRPC__METRICS_LISTEN_ADDR", "")
                check(metrics_listen.rsplit(":", 1)[-1] == str(ports.get("metrics")),
                      f"{cw}: ENGRAM_GRPC__METRICS_LISTEN_ADDR {metrics_listen!r} is not the metrics port")
                tls = "ENGRAM_GRPC__TLS__CERT_FILE" in {e["name"] for e in c.get("env", [])} \
                    or "ENGRAM_GRPC__TLS__CERT_FILE" in env
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    p = c.get(probe) or {}
                    if tls:
                        # The kubelet's gRPC probe cannot speak TLS: GET /healthz on the metrics port.
                        get = p.get("httpGet") or {}
                        check("grpc" not in p and get.get("path", "").startswith("/healthz")
                              and get.get("port") in ("metrics", ports.get("metrics")),
                              f"{cw}: {probe} must GET /healthz on the metrics port (TLS on the grpc port)")
                    else:
                        check("grpc" in p, f"{cw}: {probe} must be a native grpc probe")
                        if "grpc" in p:
                            check(p["grpc"]["port"] == ports.get("grpc"), f"{cw}: {probe} port is not the grpc port")
                if probe_path := ((c.get("readinessProbe") or {}).get("httpGet") or {}).get("path"):
                    check(probe_path == f"/healthz?service=engram.v1.{c['name'].capitalize()}Service",
                          f"{cw}: readiness must ask for the service's own name, not {probe_path}")
                if tls:
                    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
                    for key in ("ENGRAM_GRPC__TLS__CERT_FILE", "ENGRAM_GRPC__TLS__KEY_FILE"):
                        value = next((e.get("value", "") for e in c.get("env", []) if e["name"] == key), "")
                        check(any(value.startswith(m["mountPath"] + "/") and "subPath" not in m
                                  for m in mounts.values()),
                              f"{cw}: {key} is not in a mounted directory (without subPath, so renewals reach it)")
                grace = int(env.get("ENGRAM_GRPC__SHUTDOWN_GRACE_SECS", "20"))
                pre_stop = (((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds", 0)
                check(pod.get("terminationGracePeriodSeconds", 30) > grace + pre_stop,
                      f"{cw}: terminationGracePeriodSeconds must exceed shutdown grace {grace}s + preStop {pre_stop}s")
        for v in pod.get("volumes", []):
            if "secret" in v and v["secret"]["secretName"] in certificate_secrets:
                continue
            if "secret" in v:
                check(v["secret"]["secretName"] == secret_name, f"{where}: volume {v['name']} secret name")
                for item in v["secret"].get("items", []):
                    check(item["key"] in secret_keys, f"{where}: secret key {item['key']} not in the example")

    # The dev overlay's own Postgres and RabbitMQ: third-party images, so only what holds for any
    # workload (selector, non-root, no escalation, resources, the Service that names it).
    statefulsets = by_kind.get("StatefulSet", {})
    for sname, sts in statefulsets.items():
        where = f"{rel}: StatefulSet/{sname}"
        spec = sts["spec"]
        pod = spec["template"]["spec"]
        check_workload(where, spec)
        check(spec.get("serviceName") in by_kind.get("Service", {}),
              f"{where}: serviceName {spec.get('serviceName')!r} is not a Service in {rel}")
        for c in pod["containers"]:
            cw = f"{where} container {c['name']}"
            check_container(cw, c)
            check(c.get("readinessProbe") is not None, f"{cw}: no readinessProbe")
            claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
            volumes = {v["name"] for v in pod.get("volumes", [])}
            for m in c.get("volumeMounts", []):
                check(m["name"] in claims | volumes, f"{cw}: mount {m['name']} is neither a volume nor a claim")
    # A Secret an overlay brings in place of the example: the keys the services read.
    for secret in by_kind.get("Secret", {}).values():
        if secret["metadata"]["name"] == secret_name:
            keys = set(secret.get("stringData") or {}) | set(secret.get("data") or {})
            check(keys == secret_keys, f"{rel}: Secret {secret_name} has keys {sorted(keys)}, "
                                       f"the services read {sorted(secret_keys)}")

    for sname, svc in by_kind.get("Service", {}).items():
        where = f"{rel}: Service/{sname}"
        selector = svc["spec"]["selector"]
        def selects(workload):
            labels = workload["spec"]["template"]["metadata"]["labels"]
            return all(labels.get(k) == v for k, v in selector.items())
        backing = [s for s in statefulsets.values() if selects(s)]
        targets = [d for d in deployments.values() if selects(d)]
        if backing:
            check(len(backing) == 1 and not targets,
                  f"{where}: selects {len(backing)} StatefulSets and {len(targets)} Deployments, expected one workload")
            cports = {p.get("name"): p["containerPort"]
                      for c in backing[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
            for port in svc["spec"]["ports"]:
                check(port["targetPort"] in cports or port["targetPort"] in cports.values(),
                      f"{where}: targetPort {port['targetPort']} is not a container port")
            continue
        check(len(targets) == 1, f"{where}: selector matches {len(targets)} Deployments, expected 1")
        for port in svc["spec"]["ports"]:
            # The gRPC port, and the Prometheus endpoint beside it.
            check((port.get("name"), port.get("appProtocol")) in (("grpc", "grpc"), ("metrics", "http")),
                  f"{where}: a port is named grpc (appProtocol grpc) or metrics (appProtocol http)")
            for d in targets:
                cports = {p.get("name"): p["containerPort"]
                          for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
                check(port["targetPort"] in cports or port["targetPort"] in cports.values(),
                      f"{where}: targetPort {port['targetPort']} is not a container port")

for f in failures:
    print(f"  FAIL {f}", file=sys.stderr)
print(f"==> cross-checks: {checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
PY

# --- 3b. monitoring: alert rules and the Grafana dashboard -------------------------
# promtool is not in a package registry; these checks stand in for `promtool check rules`: the
# rules parse, every rule is complete, and every metric the rules and the dashboard use is one
# the services export (the README's Metrics table lists them).
"$python" - "$repo_root" <<'PY' || die "monitoring checks failed"
import json, pathlib, re, sys
import yaml

root = pathlib.Path(sys.argv[1])
readme = (root / "README.md").read_text()
section = readme.split("## Metrics", 1)[1].split("\n## ", 1)[0]
exported = set(re.findall(r"engram_[a-z0-9_]+", section))
failures = []

def metrics_in(expr):
    # Histogram series (_bucket, _count, _sum) belong to their histogram.
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in re.findall(r"engram_[a-z0-9_]+", expr)}

rules_file = root / "deploy/monitoring/alerts.yaml"
rules = yaml.safe_load(rules_file.read_text())
count = 0
for group in rules["groups"]:
    for rule in group["rules"]:
        count += 1
        name = rule.get("alert", "?")
        for key in ("alert", "expr"):
            if not rule.get(key):
                failures.append(f"{rules_file.name}: rule {name}: no {key}")
        if rule.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
            failures.append(f"{rules_file.name}: {name}: severity must be critical, warning or info")
        for key in ("summary", "description"):
            if not rule.get("annotations", {}).get(key):
                failures.append(f"{rules_file.name}: {name}: no {key} annotation")
        if rule.get("expr", "").count("(") != rule.get("expr", "").count(")"):
            failures.append(f"{rules_file.name}: {name}: unbalanced parentheses")
        for metric in metrics_in(rule.get("expr", "")) - exported:
            failures.append(f"{rules_file.name}: {name}: {metric} is not an exported metric")

dashboard_file = root / "deploy/monitoring/grafana-dashboard.json"
dashboard = json.loads(dashboard_file.read_text())
targets = 0
for panel in dashboard["panels"]:
    for target in panel.get("targets", []):
        targets += 1
        for metric in metrics_in(target["expr"]) - exported:
            failures.append(f"{dashboard_file.name}: panel {panel['title']!r}: {metric} is not an exported metric")

for failure in failures:
    print(f"  FAIL {failure}", file=sys.stderr)
print(f"==> monitoring: {count} alert rules, {len(dashboard['panels'])} dashboard panels ({targets} queries), {len(failures)} problems")
sys.exit(1 if failures else 0)
PY

# --- 4. schema validation ------------------------------------------------------
# Custom resources have no schema in kubernetes-validate (checked in stage 3), and overlay patch
# files are fragments (checked as part of their overlay's rendering): leave both out here.
mkdir -p "$work/schema"
"$python" - "$repo_root" "$work" <<'PY' || die "cannot list the manifests to validate"
import pathlib, sys, yaml
repo, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
CUSTOM = ("cert-manager.io/", "monitoring.coreos.com/")
patches = set()
for kfile in (repo / "k8s").rglob("kustomization.yaml"):
    for patch in (yaml.safe_load(kfile.read_text()) or {}).get("patches") or []:
        if "path" in patch:
            patches.add((kfile.parent / patch["path"]).resolve())
def custom(doc):
    return str(doc.get("apiVersion", "")).startswith(CUSTOM)
with open(work / "manifests.txt", "w") as out:
    for f in sorted((repo / "k8s").rglob("*.yaml")):
        if f.name == "kustomization.yaml" or f.resolve() in patches:
            continue
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        if docs and all(custom(d) for d in docs):
            continue
        out.write(f"{f.relative_to(repo)}\n")
listing = [line.split("\t")[1].strip() for line in open(work / "kustomizations.tsv")]
listing += [str(p) for p in sorted((work / "kustomize").glob("base-*.yaml"))]
with open(work / "renderings.txt", "w") as out:
    for i, path in enumerate(listing):
        docs = [d for d in yaml.safe_load_all(open(path)) if d and not custom(d)]
        target = work / "schema" / f"{i:02d}-{pathlib.Path(path).name}"
        target.write_text(yaml.safe_dump_all(docs))
        out.write(f"{target}\n")
PY
mapfile -t manifests < "$work/manifests.txt"
mapfile -t renderings < "$work/renderings.txt"
(( ${#manifests[@]} > 0 )) || die "no manifests under k8s/"

status=0
for version in "${k8s_versions[@]}"; do
    out=$work/kv-$version.log
    if (cd "$repo_root" && "$venv/bin/kubernetes-validate" --strict -k "$version" \
            "${manifests[@]}" "${renderings[@]}") > "$out" 2>&1 \
        && ! grep -q '^WARN' "$out"; then
        :
    else
        status=1
    fi
    grep -v '^INFO' "$out" || true
    passed=$(grep -c '^INFO .* passed' "$out" || true)
    problems=$(grep -c -E '^(ERROR|WARN)' "$out" || true)
    say "kubernetes-validate --strict -k $version: ${#manifests[@]} files + ${#renderings[@]} renderings," \
        "$passed resources passed, $problems errors or warnings"
done
if (( status != 0 )); then
    die "schema validation failed"
fi

say "all manifests valid:"
printf '    %s\n' "${manifests[@]}"
