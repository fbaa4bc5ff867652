//! The file store's behaviour on a pool in memory: files read back as written across reopen,
//! renames and replacements, deletes that trim whole segments, directories, refusals of a
//! volume that is not a store, and journal segments that roll over many times.

use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, VolumeSpec};
use salsa_files::{Error, FileKind, FileStore};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const SEG: u64 = 64 << 10;

fn pool(dev: &Arc<dyn Device>, create: bool) -> Pool {
    let opts = OpenOptions {
        background_gc: false,
        ..OpenOptions::default()
    };
    if create {
        let cfg = PoolConfig {
            segment_bytes: Some(MIB),
            ..PoolConfig::default()
        };
        let pool = Pool::create(vec![dev.clone()], &cfg, &opts).unwrap();
        pool.create_volume_spec("kv", 16 * MIB, &VolumeSpec::amf(4096, Some(SEG))).unwrap();
        pool
    } else {
        Pool::open(vec![dev.clone()], &opts).unwrap()
    }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

fn read_all(store: &FileStore, name: &str) -> Vec<u8> {
    let r = store.open_reader(name).unwrap();
    let mut buf = vec![0u8; r.size() as usize];
    assert_eq!(r.read_at(0, &mut buf).unwrap(), buf.len());
    buf
}

#[test]
fn files_read_back_across_a_reopen_and_deletes_trim_their_segments() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let p = pool(&dev, true);
    let store = FileStore::open(Arc::new(p.volume("kv").unwrap())).unwrap();
    store.create_dir("db").unwrap();
    // A table file of several segments written in odd-sized appends, a log synced after each
    // small write (each sync pads its last page), a manifest.
    let sst = bytes(1, 300_000);
    let mut w = store.create("db/000007.sst").unwrap();
    for chunk in sst.chunks(7_001) {
        w.append(chunk).unwrap();
    }
    w.close().unwrap();
    let mut log = Vec::new();
    let mut w = store.create("db/000008.log").unwrap();
    for i in 0..40 {
        let rec = bytes(100 + i, 37 + i as usize * 13);
        w.append(&rec).unwrap();
        w.sync().unwrap();
        log.extend_from_slice(&rec);
    }
    drop(w);
    let mut w = store.create("db/MANIFEST-000001").unwrap();
    w.append(b"manifest").unwrap();
    w.close().unwrap();
    assert_eq!(read_all(&store, "db/000007.sst"), sst);
    assert_eq!(read_all(&store, "db/000008.log"), log);
    // A read across extents from an odd offset.
    let r = store.open_reader("db/000008.log").unwrap();
    let mut part = vec![0u8; 500];
    assert_eq!(r.read_at(100, &mut part).unwrap(), 500);
    assert_eq!(part, log[100..600]);
    assert_eq!(r.read_at(log.len() as u64 - 3, &mut part).unwrap(), 3);
    let stats = store.stats();
    let sst_stats = stats.of(FileKind::Sst);
    assert_eq!((sst_stats.files, sst_stats.bytes), (1, sst.len() as u64));
    assert_eq!(sst_stats.segments, (sst.len() as u64).div_ceil(SEG));
    let mut children = store.children("db");
    children.sort();
    assert_eq!(children, ["000007.sst", "000008.log", "MANIFEST-000001"]);
    drop(store);
    p.close().unwrap();

    let p = pool(&dev, false);
    let vol = p.volume("kv").unwrap();
    let mapped_before = vol.mapped_bytes();
    let store = FileStore::open(Arc::new(vol.clone())).unwrap();
    assert_eq!(read_all(&store, "db/000007.sst"), sst);
    assert_eq!(read_all(&store, "db/000008.log"), log);
    assert_eq!(read_all(&store, "db/MANIFEST-000001"), b"manifest");
    store.delete("db/000007.sst").unwrap();
    assert!(matches!(store.open_reader("db/000007.sst"), Err(Error::NotFound(_))));
    // The table file's segments are trimmed whole: the volume maps that much less.
    assert!(
        vol.mapped_bytes() + sst.len() as u64 <= mapped_before + SEG,
        "{} {}",
        vol.mapped_bytes(),
        mapped_before
    );
    let sst_stats = store.stats().of(FileKind::Sst);
    assert_eq!(sst_stats.segments_trimmed, (sst.len() as u64).div_ceil(SEG));
}

#[test]
fn rename_replaces_atomically_and_create_replaces_an_existing_file() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let p = pool(&dev, true);
    let store = FileStore::open(Arc::new(p.volume("kv").unwrap())).unwrap();
    for (i, text) in ["MANIFEST-1\n", "MANIFEST-2\n"].iter().enumerate() {
        let mut w = store.create("db/CURRENT.tmp").unwrap();
        w.append(text.as_bytes()).unwrap();
        w.close().unwrap();
        store.rename("db/CURRENT.tmp", "db/CURRENT").unwrap();
        assert_eq!(read_all(&store, "db/CURRENT"), text.as_bytes(), "round {i}");
        assert!(!store.exists("db/CURRENT.tmp"));
    }
    let mut w = store.create("db/CURRENT").unwrap();
    w.append(b"new").unwrap();
    w.close().unwrap();
    assert_eq!(read_all(&store, "db/CURRENT"), b"new");
    assert!(store.is_dir("db"));
    assert!(matches!(store.delete_dir("db"), Err(Error::NotFound(_)) | Err(Error::NotEmpty(_))));
    assert!(matches!(store.rename("db/nothing", "db/x"), Err(Error::NotFound(_))));
    assert!(matches!(store.create(""), Err(Error::InvalidName(_))));
}

#[test]
fn the_journal_rolls_over_many_times_and_the_table_survives_each_reopen() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let mut p = pool(&dev, true);
    let mut expected: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..6u64 {
        let store = FileStore::open(Arc::new(p.volume("kv").unwrap())).unwrap();
        for (name, data) in &expected {
            assert_eq!(&read_all(&store, name), data, "round {round}: {name}");
        }
        // Each sync journals a batch of a page: 64 KiB journal segments fill every 15 or so.
        for i in 0..40u64 {
            let name = format!("db/{:06}.log", round * 100 + i);
            let data = bytes(round * 1000 + i, 10 + i as usize);
            let mut w = store.create(&name).unwrap();
            w.append(&data).unwrap();
            w.close().unwrap();
            if i % 3 == 0 {
                store.delete(&name).unwrap();
            } else {
                expected.push((name, data));
            }
        }
        let generation = store.stats().journal_generation;
        assert!(generation > round * 2, "round {round}: generation {generation}");
        drop(store);
        p.close().unwrap();
        p = pool(&dev, false);
    }
}

#[test]
fn a_volume_that_is_not_a_store_is_refused_and_left_alone() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let p = pool(&dev, true);
    p.create_volume("plain", 4 * MIB, 4096).unwrap();
    assert!(matches!(
        FileStore::open(Arc::new(p.volume("plain").unwrap())),
        Err(Error::NotAppendOnly(_))
    ));
    // An AMF volume some other program appended to.
    let other = p.create_volume_spec("other", 4 * MIB, &VolumeSpec::amf(4096, Some(SEG))).unwrap();
    other.append(3, &vec![7u8; 4096]).unwrap();
    assert!(matches!(FileStore::open(Arc::new(other.clone())), Err(Error::Foreign(_))));
    assert_eq!(other.write_point(3).unwrap(), 4096, "nothing was trimmed");
    other.append(0, &vec![9u8; 4096]).unwrap();
    assert!(matches!(FileStore::open(Arc::new(other.clone())), Err(Error::Foreign(_))));
}

#[test]
fn a_closed_file_stays_in_memory_until_read_synced_or_the_store_ends_and_a_deleted_one_is_never_written() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let p = pool(&dev, true);
    let vol = p.volume("kv").unwrap();
    let store = FileStore::open(Arc::new(vol.clone())).unwrap();
    let mapped = vol.mapped_bytes();
    // A log written, closed without a sync, and deleted: the volume never sees it.
    let mut w = store.create("db/000001.log").unwrap();
    w.append(&bytes(1, 300_000)).unwrap();
    w.close().unwrap();
    assert_eq!(vol.mapped_bytes(), mapped, "a closed file's bytes stay in memory");
    store.delete("db/000001.log").unwrap();
    let file_segments = 2..vol.size_bytes() / SEG;
    assert!(
        file_segments.clone().all(|s| vol.write_point(s).unwrap() == 0),
        "a deleted file's held bytes are never written (only the journal was)"
    );
    // A file closed without a sync reads back whole (the read writes it out first).
    let data = bytes(2, 70_000);
    let mut w = store.create("db/000002.sst").unwrap();
    w.append(&data).unwrap();
    w.close().unwrap();
    assert_eq!(read_all(&store, "db/000002.sst"), data);
    assert!(vol.mapped_bytes() > mapped);
    // One closed and never read: the store's last handle writes it durably.
    let last = bytes(3, 9_000);
    let mut w = store.create("db/000003.log").unwrap();
    w.append(&last).unwrap();
    w.close().unwrap();
    drop(store);
    p.close().unwrap();
    let p = pool(&dev, false);
    let store = FileStore::open(Arc::new(p.volume("kv").unwrap())).unwrap();
    assert_eq!(read_all(&store, "db/000003.log"), last);
    assert_eq!(read_all(&store, "db/000002.sst"), data);
}

#[test]
fn inspect_reads_a_store_without_writing_and_ignores_other_volumes() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let p = pool(&dev, true);
    let vol = p.volume("kv").unwrap();
    assert!(salsa_files::inspect(&vol).unwrap().is_none(), "a blank volume holds no store");
    let store = FileStore::open(Arc::new(vol.clone())).unwrap();
    let mut w = store.create("db/000005.sst").unwrap();
    w.append(&bytes(5, 100_000)).unwrap();
    w.sync().unwrap();
    drop(w);
    let written = p.stats().user_bytes_written;
    let stats = salsa_files::inspect(&vol).unwrap().expect("a store");
    assert_eq!(p.stats().user_bytes_written, written, "inspect writes nothing");
    let sst = stats.of(FileKind::Sst);
    assert_eq!((sst.files, sst.bytes), (1, 100_000));
    p.create_volume("plain", 4 * MIB, 4096).unwrap();
    assert!(salsa_files::inspect(&p.volume("plain").unwrap()).unwrap().is_none());
}

#[test]
fn a_file_deleted_while_its_writer_is_open_is_never_written_and_the_store_still_ends_clean() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let p = pool(&dev, true);
    let store = FileStore::open(Arc::new(p.volume("kv").unwrap())).unwrap();
    let mut gone = store.create("db/LOG.old").unwrap();
    gone.append(&bytes(7, 5_000)).unwrap();
    let kept = bytes(8, 6_000);
    let mut w = store.create("db/000009.log").unwrap();
    w.append(&kept).unwrap();
    w.close().unwrap();
    store.sync_metadata().unwrap();
    store.delete("db/LOG.old").unwrap();
    // Its writer closes after the delete, and a sync of it finds nothing to sync.
    gone.close().unwrap();
    store.sync_all().unwrap();
    drop(store);
    p.close().unwrap();
    let p = pool(&dev, false);
    let store = FileStore::open(Arc::new(p.volume("kv").unwrap())).unwrap();
    assert_eq!(
        read_all(&store, "db/000009.log"),
        kept,
        "the other closed file was written at the end"
    );
    assert!(!store.exists("db/LOG.old"));
}

#[test]
fn segments_come_back_after_every_way_a_file_goes() {
    let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", 64 * MIB));
    let p = pool(&dev, true);
    let vol = p.volume("kv").unwrap();
    let store = FileStore::open(Arc::new(vol.clone())).unwrap();
    let in_use = |store: &FileStore| store.stats().kinds.iter().map(|(_, k)| k.segments).sum::<u64>();
    // 16 MiB volume, 64 KiB segments: 254 file segments. 400 rounds of files of 3 segments each
    // run out many times over unless each way a file goes gives its segments back.
    for round in 0..400u64 {
        let name = format!("db/{:06}.sst", round % 7);
        let mut w = store.create(&name).unwrap();
        w.append(&bytes(round, 3 * SEG as usize - 100)).unwrap();
        match round % 4 {
            0 => {
                w.sync().unwrap();
                w.close().unwrap();
                store.delete(&name).unwrap();
            }
            1 => {
                w.close().unwrap(); // held in memory, then replaced by the next create of the name
                w = store.create(&name).unwrap();
                w.sync().unwrap();
                drop(w);
                store.delete(&name).unwrap();
            }
            2 => {
                w.flush().unwrap();
                w.close().unwrap();
                store.rename(&name, "db/CURRENT").unwrap(); // replaces the previous CURRENT
            }
            _ => {
                w.sync().unwrap();
                drop(w); // dropped without close, then deleted
                store.delete(&name).unwrap();
            }
        }
    }
    store.delete("db/CURRENT").unwrap();
    assert_eq!(in_use(&store), 0, "{:?}", store.stats().kinds);
    assert!(store.children("db").is_empty(), "{:?}", store.children("db"));
}
