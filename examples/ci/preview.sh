#!/usr/bin/env bash
# Pull request: preview the stack against the live cluster and write the reviewer's report.
#   STACK       the stack to preview (e.g. prod)
#   WORKDIR     the Pulumi project's directory (default: .)
# Writes preview.json and report.md in WORKDIR; exits with pulumi preview's status after the report
# is written, so a failed preview still gets its report (its errors are in it).
set -uo pipefail
cd "${WORKDIR:-.}"
pulumi stack select "$STACK" --non-interactive || exit $?
pulumi preview --refresh --json --non-interactive > preview.json
status=$?
if ! nvlfabric preview-report preview.json --title "nvlfabric preview of ${STACK}" > report.md; then
  echo "preview-report failed; the raw preview is in preview.json" >&2
  exit 1
fi
exit "$status"
