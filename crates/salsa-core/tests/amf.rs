//! AMF (append-only segment) volumes: every rule refused with nothing changed, trims of whole
//! segments that give log segments back without the GC moving data, a map a run per record,
//! write points that survive a clean close and a crash, and data right through GC and
//! recovery under a seeded workload of appends and trims.

mod common;
use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::device::{CrashDevice, CrashPlan};
use salsa_core::{Device, Error, ErrorKind, Pool, VolumeSpec};
use std::sync::Arc;

const SEG: u64 = 256 << 10;

fn amf_spec() -> VolumeSpec {
    VolumeSpec::amf(PAGE as u32, Some(SEG))
}

fn vstats(pool: &Pool, name: &str) -> salsa_core::VolumeStats {
    pool.stats().volumes.into_iter().find(|v| v.name == name).unwrap()
}

fn read_all(pool: &Pool, name: &str) -> Vec<u8> {
    let vol = pool.volume(name).unwrap();
    let mut buf = vec![0u8; vol.size_bytes() as usize];
    vol.read(0, &mut buf).unwrap();
    buf
}

fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn assert_refused(r: salsa_core::Result<()>, kind: ErrorKind, what: &str) {
    match r {
        Err(e) => assert_eq!(e.kind(), kind, "{what}: {e}"),
        Ok(()) => panic!("{what}: accepted"),
    }
}

#[test]
fn every_illegal_write_and_trim_is_refused_and_changes_nothing() {
    let (pool, _dev) = memory_pool(32, &inline_gc());
    let vol = pool.create_volume_spec("a", 8 * SEG, &amf_spec()).unwrap();
    assert_eq!(vol.controller(), "amf");
    assert_eq!(vol.preferred_write_bytes() as u64, SEG, "the segment is the preferred block");
    let mut model = vec![0u8; (8 * SEG) as usize];
    let first = bytes(1, 64 << 10);
    vol.write(0, &first).unwrap();
    model[..first.len()].copy_from_slice(&first);
    let next = bytes(2, 32 << 10);
    vol.write(64 << 10, &next).unwrap();
    model[64 << 10..96 << 10].copy_from_slice(&next);

    let junk = vec![0xAB; 4096];
    assert_refused(vol.write(0, &junk), ErrorKind::NotPermitted, "an overwrite");
    assert_refused(vol.write(92 << 10, &junk), ErrorKind::NotPermitted, "an overwrite of the last page");
    assert_refused(vol.write(100 << 10, &junk), ErrorKind::NotPermitted, "a hole");
    assert_refused(vol.write(96 << 10, &junk[..512]), ErrorKind::InvalidArgument, "a partial page");
    assert_refused(vol.write((96 << 10) + 512, &junk), ErrorKind::InvalidArgument, "a misaligned write");
    assert_refused(vol.trim(0, 64 << 10), ErrorKind::InvalidArgument, "a partial-segment trim");
    assert_refused(vol.trim(4096, SEG), ErrorKind::InvalidArgument, "a misaligned trim");
    assert_refused(vol.write_zeroes(0, 4096), ErrorKind::NotPermitted, "zeroes over data");
    // A write that fills segment 2 and runs on into segment 3, which holds data.
    vol.write(3 * SEG, &junk).unwrap();
    model[(3 * SEG) as usize..(3 * SEG) as usize + 4096].copy_from_slice(&junk);
    vol.write(2 * SEG, &bytes(3, SEG - 4096)).unwrap();
    model[(2 * SEG) as usize..(3 * SEG - 4096) as usize].copy_from_slice(&bytes(3, SEG - 4096));
    assert_refused(
        vol.write(3 * SEG - 4096, &vec![1; 8192]),
        ErrorKind::NotPermitted,
        "running into a written segment",
    );
    assert_eq!(read_all(&pool, "a"), model, "refused requests changed nothing");

    // The rest of segment 0 in one write, then segment 1 starts where it should: at its start.
    let rest = bytes(4, SEG - (96 << 10));
    vol.write(96 << 10, &rest).unwrap();
    model[96 << 10..SEG as usize].copy_from_slice(&rest);
    assert_refused(vol.write(SEG + 4096, &junk), ErrorKind::NotPermitted, "a hole in an empty segment");
    // Zeroes are appended like a write.
    vol.write_zeroes(SEG, 8192).unwrap();
    vol.write(SEG + 8192, &junk).unwrap();
    model[(SEG + 8192) as usize..(SEG + 12288) as usize].copy_from_slice(&junk);
    let st = vstats(&pool, "a");
    assert_eq!(
        (st.amf_segments, st.amf_segments_written, st.amf_segments_full),
        (8, 4, 1),
        "{st:?}"
    );

    // A whole-segment trim empties it; it is written from its start again.
    vol.trim(0, SEG).unwrap();
    model[..SEG as usize].fill(0);
    assert_eq!(read_all(&pool, "a"), model);
    assert_refused(vol.write(64 << 10, &junk), ErrorKind::NotPermitted, "a trimmed segment starts over");
    vol.write(0, &junk).unwrap();
    model[..4096].copy_from_slice(&junk);
    // Trimming a range of segments, empty ones included.
    vol.trim(SEG, 7 * SEG).unwrap();
    model[SEG as usize..].fill(0);
    assert_eq!(read_all(&pool, "a"), model);
    // Wrong settings are refused at creation, with nothing created.
    for (size, spec, what) in [
        (8 * SEG + 4096, amf_spec(), "a size that is not whole segments"),
        (
            8 * SEG,
            VolumeSpec::amf(PAGE as u32, Some(SEG + 4096)),
            "a segment that is not a power of two",
        ),
        (8 * SEG, VolumeSpec::amf(PAGE as u32, Some(32 << 10)), "a segment under 64 KiB"),
        (
            8 * SEG,
            VolumeSpec {
                sparse_pages: Some(1024),
                ..amf_spec()
            },
            "a sparse map",
        ),
        (
            8 * SEG,
            VolumeSpec {
                segment_bytes: Some(SEG),
                ..VolumeSpec::lsa(PAGE as u32)
            },
            "a segment size on an LSA volume",
        ),
    ] {
        let e = pool
            .create_volume_spec("bad", size, &spec)
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(matches!(e, Error::InvalidArgument(_)), "{what}: {e}");
        assert!(pool.volume("bad").is_err());
    }
}

/// Segments written two at a time in 64 KiB appends (a flush and a compaction at once), and
/// the same writes to an LSA volume: the extent map is a run per record (records of the
/// default size, cut by the 1 MiB log segments here: the 8 MiB segments of a real pool make
/// them longer still). With two streams, the two segments written at once never share a log
/// segment: trimming the ones that went to one stream frees the AMF volume's log segments
/// whole, while the page map's interleaved log segments stay half full; nothing of the AMF
/// volume is ever moved by the GC.
#[test]
fn the_map_is_a_run_per_record_and_trimmed_segments_free_their_log_segments() {
    let dev: Arc<dyn Device> = Arc::new(salsa_core::device::MemoryDevice::new("mem0", 200 * MIB));
    let config = salsa_core::PoolConfig {
        segment_bytes: Some(MIB),
        ..salsa_core::PoolConfig::default()
    };
    let pool = Pool::create(vec![dev], &config, &inline_gc()).unwrap();
    let seg = MIB;
    let size = 64 * seg;
    let amf = pool
        .create_volume_spec(
            "a",
            size,
            &VolumeSpec {
                segment_streams: Some(2),
                ..VolumeSpec::amf(PAGE as u32, Some(seg))
            },
        )
        .unwrap();
    let lsa = pool.create_volume_spec("l", size, &VolumeSpec::lsa(PAGE as u32)).unwrap();
    let e = pool.set_volume_policies("a", Some("greedy-hot-cold"), None).err();
    assert!(
        matches!(e, Some(Error::InvalidArgument(_))),
        "an AMF volume's placement is fixed: {e:?}"
    );
    let data = bytes(7, size);
    let chunk = 64 << 10;
    for pair in (0..size).step_by(2 * seg as usize) {
        for off in (0..seg).step_by(chunk as usize) {
            for at in [pair + off, pair + seg + off] {
                let d = &data[at as usize..(at + chunk) as usize];
                amf.write(at, d).unwrap();
                lsa.write(at, d).unwrap();
            }
        }
    }
    pool.flush().unwrap();
    let (a, l) = (vstats(&pool, "a"), vstats(&pool, "l"));
    assert!(a.map_runs <= 2 * size / MIB, "about a run per record: {}", a.map_runs);
    assert!(
        a.map_memory_bytes * 15 < l.map_memory_bytes,
        "AMF map {} bytes against the page map's {}",
        a.map_memory_bytes,
        l.map_memory_bytes
    );
    assert_eq!(read_all(&pool, "a"), data);
    let freed_by = |vol: &salsa_core::Volume| {
        let before = pool.stats().free_segments;
        // A segment that starts takes the stream freed last: pair (0, 1) takes streams 0 and
        // 1, which segment 0 then 1 give back full, so pair (2, 3) takes 1 and 0, and so on:
        // stream 0 holds segments 0, 3, 4, 7, 8, ...
        for s in (0..64).filter(|s| s % 4 == 0 || s % 4 == 3) {
            vol.trim(s * seg, seg).unwrap();
        }
        pool.flush().unwrap();
        pool.flush().unwrap();
        pool.stats().free_segments as i64 - before as i64
    };
    let (freed_amf, freed_lsa) = (freed_by(&amf), freed_by(&lsa));
    assert!(freed_amf >= 28, "32 MiB of AMF segments trimmed freed {freed_amf} log segments");
    assert!(freed_lsa <= 4, "the page map's log segments are half full: {freed_lsa} freed");
    amf.trim(0, size).unwrap();
    pool.flush().unwrap();
    while pool.maintain().unwrap() {}
    assert_eq!(vstats(&pool, "a").gc_bytes_relocated, 0, "nothing of the AMF volume was moved");
    assert_eq!(read_all(&pool, "a"), vec![0u8; size as usize]);
}

/// Write points come back from the checkpoint after a clean close and from the recovery scan
/// after a crash, where unflushed appends may be lost but flushed ones never are.
#[test]
fn write_points_survive_a_close_and_a_crash() {
    let dev = Arc::new(CrashDevice::new("crash0", 48 * MIB, CrashPlan::default()));
    let devs: Vec<Arc<dyn Device>> = vec![dev.clone()];
    let opts = inline_gc();
    let pool = Pool::create(devs.clone(), &tiny_config(), &opts).unwrap();
    let vol = pool.create_volume_spec("a", 16 * SEG, &amf_spec()).unwrap();
    let mut model = vec![0u8; (16 * SEG) as usize];
    let fill = |vol: &salsa_core::Volume, model: &mut Vec<u8>, at: u64, len: u64, seed: u64| {
        let d = bytes(seed, len);
        vol.write(at, &d).unwrap();
        model[at as usize..(at + len) as usize].copy_from_slice(&d);
    };
    fill(&vol, &mut model, 0, SEG, 1);
    fill(&vol, &mut model, SEG, 40 << 10, 2);
    fill(&vol, &mut model, 5 * SEG, 8 << 10, 3);
    drop(vol);
    pool.close().unwrap();

    let pool = Pool::open(devs.clone(), &opts).unwrap();
    assert_eq!(read_all(&pool, "a"), model);
    let vol = pool.volume("a").unwrap();
    assert_refused(
        vol.write(SEG + (36 << 10), &[1; 4096]),
        ErrorKind::NotPermitted,
        "after close: an overwrite",
    );
    fill(&vol, &mut model, SEG + (40 << 10), 8 << 10, 4);
    fill(&vol, &mut model, 5 * SEG + (8 << 10), 4 << 10, 5);
    vol.flush().unwrap();
    // Unflushed appends, then the power goes.
    let lost_from = 2 * SEG;
    vol.write(lost_from, &bytes(6, 64 << 10)).unwrap();
    dev.crash_now();
    drop(vol);
    drop(pool);
    dev.restart(CrashPlan::default());

    let pool = Pool::open(devs, &opts).unwrap();
    let got = read_all(&pool, "a");
    assert_eq!(
        &got[..lost_from as usize],
        &model[..lost_from as usize],
        "every flushed append is there"
    );
    let vol = pool.volume("a").unwrap();
    // The segment with lost appends continues one past its last surviving page.
    let surviving = (0..16u64)
        .rev()
        .find(|&p| got[(lost_from + p * 4096) as usize..][..4096] != [0u8; 4096]);
    let wp = surviving.map_or(0, |p| p + 1);
    if wp < 16 {
        vol.write(lost_from + wp * 4096, &[9; 4096]).unwrap();
    }
    assert_refused(
        vol.write(SEG + (44 << 10), &[1; 4096]),
        ErrorKind::NotPermitted,
        "after the crash: an overwrite",
    );
    fill(&vol, &mut model, SEG + (48 << 10), 4 << 10, 7);
    assert_eq!(&read_all(&pool, "a")[..lost_from as usize], &model[..lost_from as usize]);
}

/// A seeded workload of appends and whole-segment trims on a small pool, so the GC runs
/// (moving what shares log segments with live neighbours), with clean reopens and crashes
/// in between: the volume always reads as the model.
#[test]
fn appends_and_trims_through_gc_and_recovery_match_the_model() {
    for seed in 0..3u64 {
        let dev = Arc::new(CrashDevice::new("crash0", 32 * MIB, CrashPlan::default()));
        let devs: Vec<Arc<dyn Device>> = vec![dev.clone()];
        let opts = inline_gc();
        let mut pool = Pool::create(devs.clone(), &tiny_config(), &opts).unwrap();
        let segs = 64u64;
        pool.create_volume_spec("a", segs * SEG, &amf_spec()).unwrap();
        let mut model = vec![0u8; (segs * SEG) as usize];
        let mut wps = vec![0u64; segs as usize];
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut cleaned = 0;
        for step in 0..1500u64 {
            let vol = pool.volume("a").unwrap();
            let s = rng.gen_range(0..segs);
            let base = s * SEG;
            if wps[s as usize] == SEG || (wps[s as usize] > 0 && rng.gen_bool(0.02)) {
                vol.trim(base, SEG).unwrap();
                model[base as usize..(base + SEG) as usize].fill(0);
                wps[s as usize] = 0;
            } else {
                let len = (rng.gen_range(1..=16u64) * 4096).min(SEG - wps[s as usize]);
                let at = base + wps[s as usize];
                let d = bytes(seed << 32 | step, len);
                match vol.write(at, &d) {
                    Ok(()) => {
                        model[at as usize..(at + len) as usize].copy_from_slice(&d);
                        wps[s as usize] += len;
                    }
                    // Full of live data, as an application would find it: it trims its
                    // oldest table (here the fullest segment) and goes on.
                    Err(Error::NoSpace(_)) => {
                        let victim = (0..segs).max_by_key(|&k| wps[k as usize]).unwrap();
                        vol.trim(victim * SEG, SEG).unwrap();
                        model[(victim * SEG) as usize..((victim + 1) * SEG) as usize].fill(0);
                        wps[victim as usize] = 0;
                    }
                    Err(e) => panic!("seed {seed}, step {step}: {e}"),
                }
            }
            if step % 397 == 396 {
                vol.flush().unwrap();
                drop(vol);
                cleaned += pool.stats().gc_segments_cleaned;
                if step % 2 == 0 {
                    pool.close().unwrap();
                } else {
                    // Everything was flushed: a crash loses nothing.
                    dev.crash_now();
                    drop(pool);
                    dev.restart(CrashPlan::default());
                }
                pool = Pool::open(devs.clone(), &opts).unwrap();
                assert_eq!(read_all(&pool, "a"), model, "seed {seed}, step {step}: after reopening");
            }
        }
        assert_eq!(read_all(&pool, "a"), model, "seed {seed}");
        cleaned += pool.stats().gc_segments_cleaned;
        assert!(cleaned > 0, "seed {seed}: the GC never ran");
    }
}

/// Appenders of one segment never collide: four threads append pages until the segment is
/// full; every page lands exactly once, the write point counts them, and an append that does
/// not fit is refused. Not-AMF volumes refuse appends.
#[test]
fn concurrent_appends_fill_a_segment_exactly_once() {
    let (pool, _dev) = memory_pool(32, &inline_gc());
    let vol = pool.create_volume_spec("a", 4 * SEG, &amf_spec()).unwrap();
    assert_eq!(vol.segment_bytes(), Some(SEG));
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let vol = vol.clone();
            s.spawn(move || {
                let mut n = 0u32;
                loop {
                    let mut page = vec![t; PAGE];
                    page[1..5].copy_from_slice(&n.to_le_bytes());
                    match vol.append(2, &page) {
                        Ok(at) => assert!((2 * SEG..3 * SEG).contains(&at) && at % PAGE as u64 == 0),
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::NotPermitted, "{e}");
                            break;
                        }
                    }
                    n += 1;
                }
            });
        }
    });
    assert_eq!(vol.write_point(2).unwrap(), SEG);
    assert_eq!(vol.write_point(1).unwrap(), 0);
    assert!(vol.write_point(4).is_err());
    let mut seen = std::collections::HashSet::new();
    let all = read_all(&pool, "a");
    for page in all[(2 * SEG) as usize..(3 * SEG) as usize].chunks(PAGE) {
        assert!(
            seen.insert((page[0], u32::from_le_bytes(page[1..5].try_into().unwrap()))),
            "a page landed twice"
        );
    }
    assert_eq!(seen.len() as u64, SEG / PAGE as u64);
    assert_refused(vol.append(0, &[0u8; 100]).map(|_| ()), ErrorKind::InvalidArgument, "a partial page");
    let lsa = pool.create_volume("l", MIB, PAGE as u32).unwrap();
    assert_eq!(lsa.segment_bytes(), None);
    assert!(matches!(lsa.append(0, &[0u8; PAGE]), Err(Error::InvalidArgument(_))));
}
