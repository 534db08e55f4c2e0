#!/usr/bin/env bash
# Tools that build and check tessera's OCI images without a container runtime (./dev image,
# tests/kube/deploy/test_images.py): mmdebstrap (a Debian root filesystem from Debian's archive) and
# umoci (OCI layouts), and buildah (builds the Containerfiles with chroot isolation,
# tests/kube/deploy/test_containerfile_build.py), all Debian packages. Installed with apt-get when missing (root, or
# passwordless sudo as on CI runners); otherwise one line says what the image tests will skip.
# Quick when present. The .debs mmdebstrap downloads for the images are kept in
# ${TESSERA_CACHE:-$HOME/.cache/tessera}/apt-archives (cache that directory on CI).
# needed-by: test setup
set -euo pipefail
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
command -v buildah >/dev/null || missing+=(buildah)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif sudo -n true 2>/dev/null; then SUDO=(sudo -n); else
  echo "[dev] ${missing[*]} missing and no root/sudo: the image build tests will be skipped" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "[dev] ${missing[*]} missing and no apt-get: the image build tests will be skipped" >&2
  exit 0
fi
t0=$SECONDS
echo "[dev] installing ${missing[*]} (apt-get, about a minute)" >&2
"${SUDO[@]}" apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
echo "[dev] ${missing[*]} installed in $((SECONDS - t0)) s" >&2
