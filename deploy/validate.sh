#!/usr/bin/env bash
# Validates the deployment files, offline:
#
#   1. consistency: deploy/kubernetes/config.yaml parses, its ports (listen,
#      metrics.listen, oauth.listen) match the Deployment's, every
#      `{file: /etc/toolgate/secrets/KEY}` has KEY in secret.example.yaml, every
#      `{env: VAR}` is set by the Deployment, every Secret key the Deployment
#      passes as an environment variable exists, every Secret key is used (as a
#      file or a variable), and terminationGracePeriodSeconds exceeds
#      shutdown_delay + shutdown_grace + 12s (1s abort flush, 1s GOAWAY, 10s session close);
#   2. schemas: every manifest in deploy/kubernetes, the ConfigMap that
#      kustomize generates from config.yaml, and (when kubectl or kustomize is
#      installed) the whole rendered kustomization, against the Kubernetes
#      OpenAPI schemas with kubernetes-validate in strict mode (unknown fields
#      fail);
#   3. policy: checkov over deploy/ (Kubernetes manifests, the rendered
#      kustomization, the Dockerfile, secrets): zero failed checks. Skips are
#      inline, each with its reason (checkov.io/skipN annotations, # checkov:skip);
#   4. when a toolgate binary exists (TOOLGATE_BIN, target/release, target/debug):
#      `toolgate check --offline` on config.yaml and on the config.yaml of each
#      component (components/*), secrets replaced by placeholders (and the `tls`
#      component's certificate by a throwaway one made with openssl).
#
# Components (optional features an overlay adds, e.g. components/tenants) are
# rendered on top of the base in a temporary overlay and validated in 2. and 3.
#
# Usage: deploy/validate.sh        (from any directory; exit 0 only if all pass)
# The tools live in <repo>/.venv-deploy, created on first run from
# deploy/validate-requirements.txt and reused while that file is unchanged.
# PYTHON=python3.12 selects the interpreter for the venv (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPLOY="$ROOT/deploy"
K8S="$DEPLOY/kubernetes"
VENV="$ROOT/.venv-deploy"
REQUIREMENTS="$DEPLOY/validate-requirements.txt"
PYTHON="${PYTHON:-python3}"
# Newest schema set shipped by kubernetes-validate 1.37.0.
K8S_VERSION="1.37.0"
# Files in deploy/kubernetes that are not Kubernetes objects.
NOT_MANIFESTS=(kustomization.yaml config.yaml)

started=$SECONDS
failures=()
say() { printf '\n== %s\n' "$*"; }

# ---------------------------------------------------------------- tools
stamp="$VENV/.requirements.sha256"
want="$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    say "tools: $VENV (up to date)"
else
    say "tools: installing into $VENV"
    "$PYTHON" -m venv "$VENV"
    printf '*\n' >"$VENV/.gitignore" # keeps the venv out of git
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
    printf '%s\n' "$want" >"$stamp"
fi
"$VENV/bin/kubernetes-validate" --version | sed 's/^/kubernetes-validate /'
printf 'checkov %s\n' "$("$VENV/bin/checkov" --version)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# ---------------------------------------------------------------- 1. consistency
say "1. consistency: config.yaml, Deployment, Secret keys, shutdown timing"
# Also writes the ConfigMap that kustomize's configMapGenerator makes of config.yaml.
if "$VENV/bin/python" - "$K8S" "$work/configmap.generated.yaml" <<'PY'; then
import re
import sys
from pathlib import Path

import yaml

k8s, out = Path(sys.argv[1]), Path(sys.argv[2])
problems = []

text = (k8s / "config.yaml").read_text(encoding="utf-8")
config = yaml.safe_load(text)
if not isinstance(config, dict) or not config.get("tenants"):
    sys.exit("config.yaml: not a mapping with tenants")

# The generated ConfigMap, as configMapGenerator writes it (name without hash).
kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
generator = next(g for g in kustomization["configMapGenerator"] if g["name"] == "toolgate-config")
configmap = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "toolgate-config",
        "labels": generator.get("options", {}).get("labels", {}),
    },
    "data": {"config.yaml": text},
}
out.write_text(yaml.safe_dump(configmap, sort_keys=False))

deployment = yaml.safe_load((k8s / "deployment.yaml").read_text())
pod = deployment["spec"]["template"]["spec"]
container = next(c for c in pod["containers"] if c["name"] == "toolgate")
ports = {p["name"]: p["containerPort"] for p in container["ports"]}


def port_of(address):
    return int(str(address).rsplit(":", 1)[1])


if port_of(config.get("listen", "127.0.0.1:50051")) != ports.get("grpc"):
    problems.append(f"listen {config.get('listen')} != containerPort grpc {ports.get('grpc')}")
metrics = (config.get("metrics") or {}).get("listen")
if metrics is None or port_of(metrics) != ports.get("metrics"):
    problems.append(f"metrics.listen {metrics} != containerPort metrics {ports.get('metrics')}")
consent = (config.get("oauth") or {}).get("listen")
if consent is not None and port_of(consent) != ports.get("consent"):
    problems.append(f"oauth.listen {consent} != containerPort consent {ports.get('consent')}")

mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
volumes = {v["name"]: v for v in pod["volumes"]}
secret_dir = "/etc/toolgate/secrets"
secret_volume = volumes.get(mounts.get(secret_dir, ""), {}).get("secret", {})
if mounts.get("/etc/toolgate/config.yaml") is None:
    problems.append("no volumeMount at /etc/toolgate/config.yaml")
if not secret_volume:
    problems.append(f"no Secret volume mounted at {secret_dir}")

secret = yaml.safe_load((k8s / "secret.example.yaml").read_text())
if secret_volume and secret_volume.get("secretName") != secret["metadata"]["name"]:
    problems.append(
        f"Deployment mounts Secret {secret_volume.get('secretName')}, "
        f"secret.example.yaml is {secret['metadata']['name']}"
    )
keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))


def sources(node, path):
    if isinstance(node, dict):
        if set(node) == {"file"}:
            yield path, node["file"]
        for key, value in node.items():
            yield from sources(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from sources(value, f"{path}[{i}]")


def env_sources(node, path):
    if isinstance(node, dict):
        if set(node) == {"env"}:
            yield path, node["env"]
        for key, value in node.items():
            yield from env_sources(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from env_sources(value, f"{path}[{i}]")


# Secret keys the container gets as environment variables.
env_vars = {e["name"]: e for e in container.get("env", [])}
for name, var in env_vars.items():
    ref = (var.get("valueFrom") or {}).get("secretKeyRef")
    if ref is None:
        continue
    if ref.get("name") != secret["metadata"]["name"]:
        problems.append(f"env {name}: secretKeyRef names Secret {ref.get('name')}, not {secret['metadata']['name']}")
    elif ref.get("key") not in keys:
        problems.append(f"env {name}: key {ref.get('key')} is not in secret.example.yaml")
for path, var in env_sources(config, "config"):
    if var not in env_vars:
        problems.append(f"{path}: environment variable {var} is not set by the Deployment")

used = {
    var["valueFrom"]["secretKeyRef"]["key"]
    for var in env_vars.values()
    if (var.get("valueFrom") or {}).get("secretKeyRef")
}
for path, file in sources(config, "config"):
    if not file.startswith(secret_dir + "/"):
        problems.append(f"{path}: {file} is not under {secret_dir}")
        continue
    key = file[len(secret_dir) + 1 :]
    used.add(key)
    if key not in keys:
        problems.append(f"{path}: key {key} is not in secret.example.yaml")
for key in sorted(keys - used):
    problems.append(f"secret.example.yaml: key {key} is not used by config.yaml")

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def seconds(duration):
    parts = re.findall(r"(\d+)\s*(ms|s|m|h)", duration)
    if not parts or re.sub(r"[\d\s]+(ms|s|m|h)", "", duration).strip():
        problems.append(f"duration {duration!r}: only ms/s/m/h are understood here")
        return 0
    return sum(int(n) * UNITS[u] for n, u in parts)


delay = seconds(config.get("shutdown_delay", "5s"))
grace = seconds(config.get("shutdown_grace", "20s"))
period = pod.get("terminationGracePeriodSeconds", 30)
if period <= delay + grace + 12:
    problems.append(
        f"terminationGracePeriodSeconds {period} <= shutdown_delay {delay:g}s + "
        f"shutdown_grace {grace:g}s + 12s (answer cut-off calls, GOAWAY, close sessions)"
    )

for problem in problems:
    print("  -", problem)
if problems:
    sys.exit(1)
print(
    f"  ports grpc={ports['grpc']} metrics={ports['metrics']}; secret keys {sorted(keys)}; "
    f"grace {period}s > {delay:g}s + {grace:g}s + 12s"
)
PY
    echo "PASS consistency"
else
    echo "FAIL consistency"
    failures+=("consistency")
fi

# ---------------------------------------------------------------- 2. schemas
say "2. schemas: kubernetes-validate --strict, Kubernetes $K8S_VERSION"
manifests=()
for file in "$K8S"/*.yaml "$K8S"/*.yml; do
    [[ -e "$file" ]] || continue
    name="$(basename "$file")"
    [[ " ${NOT_MANIFESTS[*]} " == *" $name "* ]] && continue
    manifests+=("$file")
done
manifests+=("$work/configmap.generated.yaml")

render=()
if command -v kustomize >/dev/null 2>&1; then
    render=(kustomize build)
elif command -v kubectl >/dev/null 2>&1; then
    render=(kubectl kustomize)
fi
if ((${#render[@]})); then
    if "${render[@]}" "$K8S" >"$work/kustomize-build.yaml"; then
        manifests+=("$work/kustomize-build.yaml")
    else
        echo "FAIL ${render[*]} $K8S"
        failures+=("kustomize build")
    fi
    # Each component on top of the base, in an overlay beside a copy of deploy/.
    for component in "$K8S"/components/*/; do
        [[ -e "$component/kustomization.yaml" ]] || continue
        name="$(basename "$component")"
        mkdir -p "$work/render/$name/overlay"
        cp -r "$DEPLOY" "$work/render/$name/deploy"
        printf 'resources:\n  - ../deploy/kubernetes\ncomponents:\n  - ../deploy/kubernetes/components/%s\n' \
            "$name" >"$work/render/$name/overlay/kustomization.yaml"
        if "${render[@]}" "$work/render/$name/overlay" >"$work/kustomize-build-$name.yaml"; then
            manifests+=("$work/kustomize-build-$name.yaml")
        else
            echo "FAIL ${render[*]} with component $name"
            failures+=("kustomize build $name")
        fi
    done
else
    echo "note: neither kustomize nor kubectl found; the rendered kustomization is not validated"
fi

if [[ ! -s "$work/configmap.generated.yaml" ]]; then
    echo "FAIL schemas: the ConfigMap could not be generated (see 1.)"
    failures+=("schemas")
elif "$VENV/bin/kubernetes-validate" --kubernetes-version "$K8S_VERSION" --strict --quiet \
    "${manifests[@]}"; then
    echo "PASS schemas: ${#manifests[@]} file(s): $(for m in "${manifests[@]}"; do basename "$m"; done | paste -sd' ')"
else
    echo "FAIL schemas"
    failures+=("schemas")
fi

# ---------------------------------------------------------------- 3. policy
say "3. policy: checkov on deploy/ (kubernetes, kustomize, dockerfile, secrets)"
# --skip-download: no network (guidelines and severities come from Prisma Cloud).
if (cd "$ROOT" && "$VENV/bin/checkov" --directory deploy \
    --framework kubernetes kustomize dockerfile secrets \
    --compact --quiet --skip-download); then
    echo "PASS checkov: zero failed checks"
else
    echo "FAIL checkov"
    failures+=("checkov")
fi

# ---------------------------------------------------------------- 4. toolgate check
# The config through toolgate's own parser, when a binary is at hand (not built
# here): the Secret's paths point into a temp dir holding placeholder files.
bin="${TOOLGATE_BIN:-}"
for candidate in "$ROOT/target/release/toolgate" "$ROOT/target/debug/toolgate"; do
    [[ -z "$bin" && -x "$candidate" ]] && bin="$candidate"
done
if [[ -n "$bin" ]]; then
    say "4. config: $bin check --offline"
    mkdir -p "$work/secrets"
    "$VENV/bin/python" - "$K8S/secret.example.yaml" "$work/secrets" "$K8S/config.yaml" "$work/env" <<'PY'
import base64
import os
import shlex
import sys
from pathlib import Path

import yaml

secret = yaml.safe_load(Path(sys.argv[1]).read_text())
for i, key in enumerate(sorted(set(secret.get("stringData", {})) | set(secret.get("data", {})))):
    Path(sys.argv[2], key).write_text(f"placeholder-{i}-{key}\n")


# `{env: VAR}` sources get a placeholder of the right shape: a state key is
# 32 bytes in base64, a state URL a SQLite file in the work directory.
def env_vars(node):
    if isinstance(node, dict):
        if set(node) == {"env"}:
            yield node["env"]
        for value in node.values():
            yield from env_vars(value)
    elif isinstance(node, list):
        for value in node:
            yield from env_vars(value)


exports = []
configs = [Path(sys.argv[3]), *sorted(Path(sys.argv[3]).parent.glob("components/*/config.yaml"))]
for var in sorted({v for c in configs for v in env_vars(yaml.safe_load(c.read_text()))}):
    if var.endswith("_KEY"):
        value = base64.b64encode(os.urandom(32)).decode()
    elif var.endswith("_URL"):
        value = f"sqlite://{Path(sys.argv[2]).parent / 'state.db'}"
    else:
        value = f"placeholder-{var}"
    exports.append(f"export {var}={shlex.quote(value)}")
Path(sys.argv[4]).write_text("".join(line + "\n" for line in exports))
PY
    mkdir -p "$work/admin" "$work/tenants" "$work/tls"
    printf 'placeholder-admin-token\n' >"$work/admin/admin-token"
    # The `tls` component's Secret: a throwaway self-signed certificate (its
    # own CA), valid long enough that `check` does not warn of its expiry.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 60 \
        -subj /CN=toolgate -addext subjectAltName=DNS:toolgate \
        -keyout "$work/tls/tls.key" -out "$work/tls/tls.crt" 2>/dev/null
    cp "$work/tls/tls.crt" "$work/tls/ca.crt"
    for config in "$K8S/config.yaml" "$K8S"/components/*/config.yaml; do
        [[ -e "$config" ]] || continue
        sed -e "s|/etc/toolgate/secrets/|$work/secrets/|g" \
            -e "s|/etc/toolgate/admin/|$work/admin/|g" \
            -e "s|/etc/toolgate/tenants|$work/tenants|g" \
            -e "s|/etc/toolgate/tls/|$work/tls/|g" \
            "$config" >"$work/config.yaml"
        # shellcheck disable=SC1091
        if (source "$work/env" && "$bin" check --offline --config "$work/config.yaml"); then
            echo "PASS toolgate check --offline ${config#"$ROOT"/}"
        else
            echo "FAIL toolgate check --offline ${config#"$ROOT"/} (is $bin older than the config keys it is given?)"
            failures+=("toolgate check ${config#"$ROOT"/}")
        fi
    done
else
    say "4. config: skipped (no toolgate binary: set TOOLGATE_BIN or build target/release/toolgate)"
fi

# ---------------------------------------------------------------- summary
say "summary ($((SECONDS - started))s)"
if ((${#failures[@]})); then
    echo "FAILED: ${failures[*]}"
    exit 1
fi
echo "OK: consistency, schemas (Kubernetes $K8S_VERSION, strict), checkov${bin:+, toolgate check}"
