#!/usr/bin/env bash
# Builds (once, cached) the Debian base root filesystem and prints its tarball's path; the recipe
# is internal/envinstall/debian-base.sh, which `corral env install` embeds and runs the same way.
exec bash "$(dirname "$0")/../internal/envinstall/debian-base.sh" "$@"
