#!/usr/bin/env bash
# Validates Kubernetes manifests against the Kubernetes API's own schemas with kubeconform, with
# nothing but the Go module proxy: kubeconform is built from its module, the API's OpenAPI
# documents come from the k8s.io/kubernetes module, and internal/deploycheck/kubeschema turns
# them into kubeconform's standalone-strict schemas. Both are made once and cached under
# /var/cache/corral/kubeconform (a per-user cache when that is not writable); later runs only
# validate.
#
#   scripts/kubeconform.sh [FILE|DIR]...   # default: deploy/kubernetes
#
# A directory contributes its *.yaml files except kustomization.yaml, which is kustomize's
# input and no Kubernetes resource. Exits non-zero when any manifest is invalid or has no schema.
set -euo pipefail
kubeconform_version="${KUBECONFORM_VERSION:-v0.8.0}"
kubernetes_version="${KUBERNETES_VERSION:-v1.34.4}"
root=$(cd "$(dirname "$0")/.." && pwd)

cache="${CORRAL_CACHE:-/var/cache/corral}/kubeconform"
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/corral/kubeconform"
  mkdir -p "$cache"
fi
work=$(mktemp -d)
# The module cache's files are read-only; make them removable first.
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

# Modules that are not this repository's are fetched from an empty directory, so that nothing
# reads or touches go.mod; GOFLAGS is cleared because `go install pkg@version` refuses -mod.
outside() { (cd "$work" && GOFLAGS= GOWORK=off "$@"); }

bin="$cache/$kubeconform_version/kubeconform"
if [ ! -x "$bin" ]; then
  echo "kubeconform.sh: building kubeconform $kubeconform_version (once)" >&2
  outside env GOBIN="$work/bin" go install "github.com/yannh/kubeconform/cmd/kubeconform@$kubeconform_version"
  mkdir -p "$(dirname "$bin")"
  mv "$work/bin/kubeconform" "$bin"
fi

# The schemas depend on the Kubernetes version and on the converter: a changed converter makes
# a new set instead of reusing one it would no longer write.
converter=$(cat "$root"/internal/deploycheck/kubeschema/*.go | sha256sum | cut -c1-12)
schemas="$cache/schemas/$kubernetes_version-$converter"
if [ ! -d "$schemas" ]; then
  echo "kubeconform.sh: making the schemas of Kubernetes $kubernetes_version (once)" >&2
  # A throwaway module cache: only api/openapi-spec of the module (18 MB zipped) is needed.
  dir=$(outside env GOMODCACHE="$work/mod" go mod download -json "k8s.io/kubernetes@$kubernetes_version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir/api/openapi-spec/v3" ] || { echo "kubeconform.sh: k8s.io/kubernetes@$kubernetes_version has no api/openapi-spec/v3" >&2; exit 1; }
  mkdir -p "$cache/schemas"
  tmp=$(mktemp -d "$cache/schemas/.new.XXXXXX")
  (cd "$root" && go run ./internal/deploycheck/kubeschema -spec "$dir/api/openapi-spec/v3" -out "$tmp")
  chmod 755 "$tmp"
  # Written whole, then renamed into place: a run that finds the directory finds it complete.
  # Another run that got there first wins.
  mv -T "$tmp" "$schemas" 2>/dev/null || rm -rf "$tmp"
fi

[ $# -gt 0 ] || set -- "$root/deploy/kubernetes"
files=()
for arg in "$@"; do
  if [ -d "$arg" ]; then
    for f in "$arg"/*.yaml; do
      [ -e "$f" ] || continue
      [ "$(basename "$f")" = kustomization.yaml ] && continue
      files+=("$f")
    done
  else
    files+=("$arg")
  fi
done
[ ${#files[@]} -gt 0 ] || { echo "kubeconform.sh: no manifests in $*" >&2; exit 1; }
exec "$bin" -strict -summary -schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" "${files[@]}"
