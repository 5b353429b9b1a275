#!/usr/bin/env bash
# Main branch: apply the reviewed change. The preview the reviewer read was made with --refresh;
# `up --refresh` starts from the cluster as it is now too.
#   STACK, WORKDIR as for preview.sh
set -euo pipefail
cd "${WORKDIR:-.}"
pulumi stack select "$STACK" --non-interactive
pulumi up --refresh --yes --skip-preview --non-interactive
