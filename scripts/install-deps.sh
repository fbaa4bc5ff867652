#!/usr/bin/env bash
# Installs the real NBD clients and tools the end-to-end tests drive, when missing.
set -euo pipefail
need=()
for pair in fio:fio qemu-io:qemu-utils qemu-img:qemu-utils nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdfuse:nbdfuse \
            nbdkit:nbdkit nbdsh:python3-libnbd fusermount3:fuse3 mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs losetup:mount \
            c++:g++ mariadbd:mariadb-server sysbench:sysbench openssl:openssl pkg-config:pkg-config \
            swift-object-server:swift-object db_bench:rocksdb-tools ldb:rocksdb-tools \
            mkfs.btrfs:btrfs-progs compsize:btrfs-compsize; do
  tool=${pair%%:*}; pkg=${pair##*:}
  command -v "$tool" >/dev/null 2>&1 || need+=("$pkg")
done
# PostgreSQL (pgbench in the database benchmark): Debian keeps its server tools off PATH.
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1 || need+=(postgresql)
# Libraries the build links (NBD over TLS uses the system's OpenSSL; the RocksDB plugin builds
# against Debian's RocksDB).
for pkg in libssl-dev librocksdb-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  pkgs=$(printf '%s\n' "${need[@]}" | sort -u | tr '\n' ' ')
  echo "installing: $pkgs"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q >/dev/null
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $pkgs >/dev/null
fi
# Ceph (scripts/ceph_on_salsa.py and its short test): monitor, manager, OSD, the rados and rbd
# tools, and librados for Python. Optional: where the packages do not install, the test that
# needs them is skipped with a message, and nothing else depends on them.
ceph_need=()
for pair in ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd rados:ceph-common; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || ceph_need+=("${pair##*:}")
done
dpkg -s python3-rados >/dev/null 2>&1 || ceph_need+=(python3-rados)
if [ ${#ceph_need[@]} -gt 0 ]; then
  echo "installing: ${ceph_need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${ceph_need[@]}" >/dev/null \
    || echo "Ceph did not install: its case study's test will be skipped"
fi
# cargo-fuzz, for the short fuzzing run of the NBD codec (libFuzzer, built with the C++ compiler).
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing: cargo-fuzz"
  cargo install cargo-fuzz --locked --version "^0.13" --quiet
fi
