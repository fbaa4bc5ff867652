"""Pools and volumes from Python: I/O, persistence, statistics, and the errors bad input gets."""

import errno

import pytest

import salsa


def test_write_read_trim_flush_and_reopen(scratch):
    img = str(scratch / "pool.img")
    with salsa.Pool.create([f"{img}:256M"], segment_bytes=1 << 20) as pool:
        vol = pool.create_volume("data", 64 << 20)
        assert (vol.name, vol.size_bytes, vol.page_bytes, vol.controller) == ("data", 64 << 20, 4096, "lsa")
        pattern = bytes(range(256)) * 32  # 8 KiB
        vol.write(4096, pattern)
        vol.write(1 << 20, b"\xab" * 4096, fua=True)
        assert vol.read(4096, 8192) == pattern
        vol.trim(8192, 4096)
        assert vol.read(8192, 4096) == bytes(4096)
        vol.flush()
        assert vol.mapped_bytes == 2 * 4096
        stats = pool.stats()
        assert stats["user_bytes_written"] == 3 * 4096
        assert [v["name"] for v in stats["volumes"]] == ["data"]
        assert pool.volume_names() == ["data"]
        extent = pool.create_volume("runs", 16 << 20, controller="extent", placement="sepbit")
        extent.write(0, b"\x01" * 65536)
    assert pool.closed
    with salsa.Pool.open([img]) as pool:
        vol = pool.volume("data")
        assert vol.read(4096, 4096) == pattern[:4096]
        assert vol.read(8192, 4096) == bytes(4096)
        assert vol.read(1 << 20, 4096) == b"\xab" * 4096
        assert pool.volume("runs").read(0, 65536) == b"\x01" * 65536
        pool.delete_volume("runs")
        assert pool.volume_names() == ["data"]


def test_bad_input_gets_a_clear_error_and_changes_nothing(scratch):
    img = str(scratch / "pool.img")
    pool = salsa.Pool.create([f"{img}:128M"])
    vol = pool.create_volume("v", 16 << 20)
    vol.write(0, b"\x07" * 4096)
    with pytest.raises(ValueError, match="invalid argument"):
        vol.write(16 << 20, b"\x00" * 4096)  # past the end
    with pytest.raises(ValueError):
        vol.read(0, 2 << 30)  # larger than one read may be
    with pytest.raises(KeyError):
        pool.volume("missing")
    with pytest.raises(ValueError, match="already exists"):
        pool.create_volume("v", 16 << 20)
    with pytest.raises(ValueError, match="unknown controller"):
        pool.create_volume("w", 16 << 20, controller="btree")
    with pytest.raises(ValueError, match="unknown placement policy"):
        pool.create_volume("w", 16 << 20, placement="nope")
    assert vol.read(0, 4096) == b"\x07" * 4096
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        vol.read(0, 4096)
    pool.close()  # again: nothing to do
    # A device that holds a pool is not formatted again; a missing one is not created.
    with pytest.raises(FileExistsError):
        salsa.Pool.create([f"{img}:128M"])
    with pytest.raises(OSError) as missing:
        salsa.Pool.open([str(scratch / "absent.img")])
    assert missing.value.errno == errno.ENOENT
    assert not (scratch / "absent.img").exists()
    with pytest.raises(ValueError):
        salsa.Pool.create([f"{scratch / 'x.img'}:12Q"])
    with pytest.raises(ValueError, match="unknown array layout"):
        salsa.Pool.create([f"{scratch / 'y.img'}:64M"], array="raid7")
    with salsa.Pool.open([img]) as again:
        assert again.volume("v").read(0, 4096) == b"\x07" * 4096


def test_a_full_pool_says_so_and_keeps_what_it_acknowledged(scratch):
    with salsa.Pool.create([f"{scratch / 'small.img'}:64M"], spare_percent=10) as pool:
        vol = pool.create_volume("thin", 1 << 30)  # thin: more than the pool holds
        written = 0
        with pytest.raises(OSError) as full:
            while True:
                vol.write(written, written.to_bytes(8, "little") * 4096)
                written += 32768
        assert full.value.errno == errno.ENOSPC
        assert "no space left in the pool" in str(full.value)
        assert written > 32 << 20
        for offset in range(0, written, 32768):
            assert vol.read(offset, 8) == offset.to_bytes(8, "little")


def test_device_models_as_pool_devices(scratch):
    with salsa.Pool.create([f"ssd:size=256M,file={scratch / 'ssd.img'}"]) as pool:
        vol = pool.create_volume("v", 32 << 20)
        vol.write(0, b"\x11" * (1 << 20))
        assert vol.read(0, 1 << 20) == b"\x11" * (1 << 20)
        counters = pool.stats()["device_counters"]
        assert any(c["counter"] for c in counters)
