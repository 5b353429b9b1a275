#!/usr/bin/env bash
# Pull request: post report.md as the PR's nvlfabric comment, replacing the one posted before
# (found by its marker), so the thread holds one current report.
#   PR          the pull request's number; GH_TOKEN the token `gh` uses (the workflow's GITHUB_TOKEN)
#   WORKDIR     where report.md is (default: .)
set -euo pipefail
cd "${WORKDIR:-.}"
marker="<!-- nvlfabric-preview -->"
{ echo "$marker"; cat report.md; } > comment.md
if gh pr comment "$PR" --edit-last --body-file comment.md 2>/dev/null; then
  exit 0
fi
gh pr comment "$PR" --body-file comment.md
