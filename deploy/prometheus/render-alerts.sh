#!/bin/sh
# Fills in the runbook links of alerts.yml for one installation and prints the rule file on stdout:
#   deploy/prometheus/render-alerts.sh https://git.example.com/pin/identity/-/blob/main/docs/runbooks.md \
#       > /etc/prometheus/rules/identity.yml
# The argument (or RUNBOOK_BASE_URL) is where docs/runbooks.md is published; each rule appends its #anchor.
# A second argument renders another file with the same placeholder (alerts.test.yml, for promtool).
set -eu

base=${1:-${RUNBOOK_BASE_URL:-}}
source_file=${2:-$(dirname "$0")/alerts.yml}

# Absolute http(s), no fragment (the rules add theirs), nothing that needs quoting inside a YAML string.
if ! printf '%s' "$base" | grep -Eq '^https?://[A-Za-z0-9._~:/?&=%+@!,;()*-]+$'; then
    echo "error: the runbook base URL must be an absolute http(s) URL without '#' or quotes," \
        "e.g. https://git.example.com/pin/identity/-/blob/main/docs/runbooks.md (got '$base')" >&2
    exit 2
fi

# sed's replacement treats & and \ specially, and | is the delimiter here.
escaped=$(printf '%s' "$base" | sed 's/[&|\\]/\\&/g')
sed "s|\${RUNBOOK_BASE_URL}|$escaped|g" "$source_file"
