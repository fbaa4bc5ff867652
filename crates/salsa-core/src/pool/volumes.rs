//! The volume table (create, grow, delete; every change is durable in the pool metadata before
//! it takes effect) and the [`Volume`] handle: byte-addressed reads, writes, trims and
//! write-zeroes on whole and partial pages.

use super::{human_bytes, Pool, MAX_VOLUME_PAGES};
use crate::controller::Controller;
pub use crate::controller::VolumeSpec;
use crate::dirty::PagedPayload;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::{ControllerKind, VolumeRecord, MAX_VOLUMES, MAX_VOLUME_NAME_BYTES};
use crate::log::payload::WriteBuffer;
use crate::policy::victim::VictimPolicy;
use crate::policy::VictimParams;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Instant;

/// What [`Volume::write_paged_now`] did with a write.
pub enum WrittenNow {
    /// Written (into the write buffer). To be acknowledged at once (`None`), or not before the
    /// instant given: the write's turn while user writes are paced (`crate::pacing`).
    Written { ack_at: Option<Instant> },
    /// Nothing written: the write needs a wait. Write it with [`Volume::write_paged`] on a
    /// thread that may wait.
    NotNow(PagedPayload),
}

pub(super) fn validate_volume(name: &str, page_bytes: u32, grain_bytes: u32, size_bytes: u64) -> Result<()> {
    if name.is_empty() || name.len() > MAX_VOLUME_NAME_BYTES || name.chars().any(|c| c.is_control() || c == '/') {
        return Err(Error::InvalidArgument(format!(
            "volume name {name:?} must be 1 to {MAX_VOLUME_NAME_BYTES} bytes without '/' or control characters"
        )));
    }
    if !(4096..=65536).contains(&page_bytes) || !page_bytes.is_multiple_of(grain_bytes) || !page_bytes.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "page size {page_bytes} must be a power of two from 4 KiB to 64 KiB and a multiple of the grain ({grain_bytes})"
        )));
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(page_bytes as u64) {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes} must be a non-zero multiple of the page size {page_bytes}"
        )));
    }
    if size_bytes / page_bytes as u64 > MAX_VOLUME_PAGES {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes} exceeds {MAX_VOLUME_PAGES} pages"
        )));
    }
    Ok(())
}

impl Pool {
    // ----- volumes -----

    /// Creates an LSA volume with the pool's default policies. Its size may exceed the free
    /// space (thin provisioning).
    pub fn create_volume(&self, name: &str, size_bytes: u64, page_bytes: u32) -> Result<Volume> {
        self.create_volume_spec(name, size_bytes, &VolumeSpec::lsa(page_bytes))
    }

    /// Creates an LSA volume with the named placement policy.
    pub fn create_volume_with(&self, name: &str, size_bytes: u64, page_bytes: u32, placement: &str) -> Result<Volume> {
        let spec = VolumeSpec {
            placement: Some(placement.into()),
            ..VolumeSpec::lsa(page_bytes)
        };
        self.create_volume_spec(name, size_bytes, &spec)
    }

    /// Creates a volume as `spec` describes: its controller, page size and policies, all
    /// recorded durably with it.
    pub fn create_volume_spec(&self, name: &str, size_bytes: u64, spec: &VolumeSpec) -> Result<Volume> {
        self.eng.log.check_writable()?;
        validate_volume(name, spec.page_bytes, self.eng.log.geo().grain_bytes, size_bytes)?;
        if spec.controller == ControllerKind::Hybrid {
            self.check_hybrid_devices()?;
        }
        let class = spec.storage;
        if self.eng.log.capacity().segments_of(class.types()) == 0 {
            return Err(Error::InvalidArgument(format!(
                "storage class {} needs a {} device in the pool (declare its type at format: PATH@flash, PATH@hdd)",
                class.name(),
                if class == crate::log::StorageClass::Fast {
                    "flash or NVM"
                } else {
                    "disk"
                }
            )));
        }
        let victim = spec.victim.clone().unwrap_or_default();
        let victim_policy = self.volume_victim_policy(&victim)?;
        let mut meta = self.eng.log.meta().lock();
        if meta.volumes.iter().any(|v| v.name == name) {
            return Err(Error::VolumeExists(name.into()));
        }
        if meta.volumes.len() >= MAX_VOLUMES {
            return Err(Error::InvalidArgument(format!("a pool holds at most {MAX_VOLUMES} volumes")));
        }
        let id = meta.next_volume_id;
        let mut next = meta.clone();
        next.next_volume_id += 1;
        let rec = VolumeRecord {
            id,
            name: name.into(),
            size_bytes,
            page_bytes: spec.page_bytes,
            placement: match spec.controller {
                ControllerKind::Amf => crate::controller::amf::PLACEMENT.to_string(),
                _ => spec.placement.clone().unwrap_or_else(|| self.default_placement.clone()),
            },
            victim,
            controller: spec.controller,
            settings: crate::controller::settings_for(spec, size_bytes, self.eng.log.geo()).map_err(Error::InvalidArgument)?,
        };
        // Built before the entry is durable, so a bad policy name or setting changes nothing.
        let vol = crate::controller::build(&rec, self.eng.log.geo(), &self.policies).map_err(Error::InvalidArgument)?;
        self.check_streams_fit(name, vol.streams().layout().count())?;
        next.volumes.push(rec);
        self.eng.log.write_pool_meta(&mut next)?;
        *meta = next;
        self.eng.add_volume(vol.clone());
        self.eng.set_volume_victim_policy(id, victim_policy);
        Ok(Volume {
            eng: self.eng.clone(),
            vol,
        })
    }

    /// Refuses a new volume of `new_streams` streams when the streams of all volumes would keep
    /// so many segments open that the pool would have no segment's worth of room left for
    /// data: each stream may keep a partly written segment of its own, which no other stream
    /// can use ([`crate::log::Log::usable_grains_for_streams`]). (Before, 85 empty
    /// volumes of 12 streams each on a 1 GiB pool were accepted, and the next write found no
    /// usable space.) The message says how many streams fit and what else would.
    fn check_streams_fit(&self, name: &str, new_streams: u32) -> Result<()> {
        let log = &self.eng.log;
        let geo = log.geo();
        let grain = geo.grain_bytes as u64;
        let (streams_now, held_bytes) = self.eng.volumes.read().values().fold((0u64, 0u64), |(s, h), v| {
            (s + v.streams().layout().count() as u64, h + v.mapped_bytes())
        });
        // Only what the streams take away is checked: a thin pool may hold (or be promised)
        // more than it has room for, and a full one still takes volumes its streams leave room for.
        let needed = geo.data_grains_per_segment() as u64 * grain;
        let usable_after = log.usable_grains_for_streams(streams_now + new_streams as u64) * grain;
        if usable_after >= needed {
            return Ok(());
        }
        // The most streams that still leave a segment's worth of room.
        let mut fit = 0u64;
        while log.usable_grains_for_streams(fit + 1) * grain >= needed {
            fit += 1;
        }
        Err(Error::InvalidArgument(format!(
            "volume {name:?} does not fit: its {new_streams} streams and the {streams_now} of the pool's volumes would each keep \
             a segment of {} open, leaving {} usable for the {} the volumes hold now; this pool of {} segments has room \
             for {fit} streams in all. Use a placement with fewer streams (user-gc has 2), delete a volume, or format \
             the pool with smaller segments (--segment-size) or on more space",
            human_bytes(geo.segment_bytes),
            human_bytes(usable_after),
            human_bytes(held_bytes),
            geo.total_segments
        )))
    }

    /// A hybrid volume needs a linear pool with both a slow device (its data) and a fast one
    /// (its copies).
    fn check_hybrid_devices(&self) -> Result<()> {
        let array = self.eng.log.array();
        if array.kind() != crate::ArrayKind::Linear {
            return Err(Error::InvalidArgument(format!(
                "a hybrid volume needs a linear pool (this one is {})",
                array.kind().name()
            )));
        }
        let capacity = self.eng.log.capacity();
        if capacity.segments_of(&crate::log::SLOW_TYPES) == 0 || capacity.segments_of(&crate::log::FAST_TYPES) == 0 {
            return Err(Error::InvalidArgument(
                "a hybrid volume needs a slow device (a disk: declare it with PATH@hdd, or an hdd:/hmsmr: model) for its data and a fast one (flash or NVM) for copies of hot data; this pool has not both".into(),
            ));
        }
        Ok(())
    }

    /// The victim policy a volume names (`""`: the pool's, `None`), built; refuses an unknown
    /// name.
    pub(super) fn volume_victim_policy(&self, name: &str) -> Result<Option<Arc<dyn VictimPolicy>>> {
        if name.is_empty() {
            return Ok(None);
        }
        let params = VictimParams { aging: self.gc_aging };
        let p = self.policies.victim(name, &params).map_err(Error::InvalidArgument)?;
        Ok(Some(Arc::from(p)))
    }

    /// Changes a volume's placement policy and/or victim policy (`Some("")`: back to the
    /// pool's), durably; both take effect for new writes and the next victim choice. Data
    /// already written stays where it is until the GC moves it.
    pub fn set_volume_policies(&self, name: &str, placement: Option<&str>, victim: Option<&str>) -> Result<()> {
        self.eng.log.check_writable()?;
        let vol = self.volume(name)?.vol;
        let pages = vol.size_bytes() / vol.page_bytes() as u64;
        if placement.is_some() && vol.kind() == ControllerKind::Amf {
            return Err(Error::InvalidArgument(format!(
                "volume {name:?} is append-only: each segment has its own stream ({}); it takes no placement policy",
                crate::controller::amf::PLACEMENT
            )));
        }
        let new_placement = match placement {
            Some(p) => Some(self.policies.placement(p, pages).map_err(Error::InvalidArgument)?),
            None => None,
        };
        let new_victim = match victim {
            Some(v) => Some(self.volume_victim_policy(v)?),
            None => None,
        };
        // No GC victim of this volume may be in progress while its streams are replaced.
        let _gc = self.eng.gc_lock.write();
        {
            let mut meta = self.eng.log.meta().lock();
            let mut next = meta.clone();
            for v in next.volumes.iter_mut().filter(|v| v.id == vol.id()) {
                if let Some(p) = placement {
                    v.placement = p.to_string();
                }
                if let Some(p) = victim {
                    v.victim = p.to_string();
                }
            }
            self.eng.log.write_pool_meta(&mut next)?;
            *meta = next;
        }
        if let (Some(p), Some(name)) = (new_placement, placement) {
            vol.set_placement(&self.eng.log, p, name)?;
        }
        if let Some(v) = new_victim {
            self.eng.set_volume_victim_policy(vol.id(), v);
        }
        Ok(())
    }

    /// Changes how a volume compresses new writes, durably; pages already written stay as
    /// they are stored until rewritten. An LSA volume of pages larger than the grain only.
    pub fn set_volume_compression(&self, name: &str, compression: crate::Compression) -> Result<()> {
        self.eng.log.check_writable()?;
        let vol = self.volume(name)?.vol;
        if vol.kind() != ControllerKind::Lsa {
            return Err(Error::InvalidArgument(format!(
                "volume {name:?} is a {} volume: only LSA volumes compress",
                vol.kind().name()
            )));
        }
        let spec = VolumeSpec {
            compression,
            ..VolumeSpec::lsa(vol.page_bytes())
        };
        crate::controller::settings_for(&spec, vol.size_bytes(), self.eng.log.geo()).map_err(Error::InvalidArgument)?;
        let pages = vol.size_bytes() / vol.page_bytes() as u64;
        // No GC victim of this volume may be in progress while its streams are replaced.
        let _gc = self.eng.gc_lock.write();
        let placement_name = {
            let mut meta = self.eng.log.meta().lock();
            let mut next = meta.clone();
            let mut placement_name = String::new();
            for v in next.volumes.iter_mut().filter(|v| v.id == vol.id()) {
                placement_name = v.placement.clone();
                let key = crate::controller::lsa::SETTING_COMPRESSION;
                match v.settings.iter_mut().find(|(k, _)| *k == key) {
                    Some(setting) => setting.1 = compression.to_setting(),
                    // A volume that never compressed records nothing while it stays off.
                    None if compression.is_on() => v.settings.push((key, compression.to_setting())),
                    None => {}
                }
            }
            if next != *meta {
                self.eng.log.write_pool_meta(&mut next)?;
                *meta = next;
            }
            placement_name
        };
        let placement = self.policies.placement(&placement_name, pages).map_err(Error::InvalidArgument)?;
        vol.set_compression(&self.eng.log, compression, placement, &placement_name)
    }

    /// A handle on a volume.
    pub fn volume(&self, name: &str) -> Result<Volume> {
        let found = self.eng.volumes.read().values().find(|v| v.name() == name).cloned();
        let vol = found.ok_or_else(|| Error::VolumeNotFound(name.into()))?;
        Ok(Volume {
            eng: self.eng.clone(),
            vol,
        })
    }

    /// Names of all volumes.
    pub fn volume_names(&self) -> Vec<String> {
        self.eng.volumes.read().values().map(|v| v.name().to_string()).collect()
    }

    /// Grows a volume.
    pub fn grow_volume(&self, name: &str, new_size_bytes: u64) -> Result<()> {
        self.eng.log.check_writable()?;
        let vol = self.volume(name)?.vol;
        validate_volume(name, vol.page_bytes(), self.eng.log.geo().grain_bytes, new_size_bytes)?;
        if new_size_bytes < vol.size_bytes() {
            return Err(Error::InvalidArgument(format!(
                "volume {name:?} is {} bytes; shrinking is not supported (create a smaller volume and copy)",
                vol.size_bytes()
            )));
        }
        let mut meta = self.eng.log.meta().lock();
        let mut next = meta.clone();
        for v in next.volumes.iter_mut().filter(|v| v.id == vol.id()) {
            v.size_bytes = new_size_bytes;
        }
        self.eng.log.write_pool_meta(&mut next)?;
        *meta = next;
        vol.grow(new_size_bytes)
    }

    /// Deletes a volume; its space returns to the pool.
    pub fn delete_volume(&self, name: &str) -> Result<()> {
        self.eng.log.check_writable()?;
        let vol = self.volume(name)?.vol;
        // Its buffered pages die with it (before the GC is held: a destage in progress may
        // be waiting for the GC to make room).
        self.eng.dirty.forget_volume(&self.eng.log, vol.id());
        // No GC victim of this volume may be in progress.
        let _gc = self.eng.gc_lock.write();
        vol.retire();
        {
            let mut meta = self.eng.log.meta().lock();
            let mut next = meta.clone();
            next.volumes.retain(|v| v.id != vol.id());
            self.eng.log.write_pool_meta(&mut next)?;
            *meta = next;
        }
        // The deletion is durable: the volume's records are now garbage. Let in-flight records
        // land before their segments can be reused.
        self.eng.log.remove_streams(vol.id())?;
        self.eng.volumes.write().remove(&vol.id());
        self.eng.protect_restricted_classes();
        vol.release(&self.eng.log);
        // The log only, not the write buffer: a destage of another volume's pages may need
        // the GC, which waits for the lock held here (a hang, before).
        self.eng.log.flush()?;
        self.eng.log.add_mapped_grains(-(vol.mapped_grains() as i64));
        self.eng.log.capacity().free_owned_by(vol.id());
        Ok(())
    }
}

/// One range of a share batch ([`Volume::share`]), in bytes: afterwards
/// `[dst_offset, dst_offset + len_bytes)` reads what `[src_offset, src_offset + len_bytes)` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRange {
    pub dst_offset: u64,
    pub src_offset: u64,
    pub len_bytes: u64,
}

/// Most ranges in one share batch.
pub const MAX_SHARE_RANGES: usize = crate::controller::lsa::MAX_SHARE_RANGES;
/// Most logical owners of one physical page (fewer in pools of grains under 4 KiB, whose
/// metadata pages hold fewer entries).
pub const MAX_SHARE_OWNERS: u32 = crate::controller::lsa::MAX_SHARE_OWNERS;

/// A volume handle: byte-addressed I/O, whatever controller maps the volume.
#[derive(Clone)]
pub struct Volume {
    eng: Arc<Engine>,
    vol: Arc<dyn Controller>,
}

impl Volume {
    pub fn name(&self) -> &str {
        self.vol.name()
    }
    pub fn size_bytes(&self) -> u64 {
        self.vol.size_bytes()
    }
    pub fn page_bytes(&self) -> u32 {
        self.vol.page_bytes()
    }
    /// The smallest write that costs no read-modify-write: the page, or for a dual-mapping
    /// volume its small pages.
    pub fn preferred_write_bytes(&self) -> u32 {
        self.vol.preferred_write_bytes()
    }
    /// The controller that maps the volume.
    pub fn controller(&self) -> &'static str {
        self.vol.kind().name()
    }
    /// Mapped (written and not trimmed) bytes.
    pub fn mapped_bytes(&self) -> u64 {
        self.vol.mapped_bytes()
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if self.vol.is_retired() {
            return Err(Error::VolumeNotFound(self.vol.name().to_string()));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.vol.size_bytes() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range of {len} bytes at {offset} is past the end of volume {:?} ({} bytes)",
                self.vol.name(),
                self.vol.size_bytes()
            ))),
        }
    }

    /// Reads `buf.len()` bytes at `offset`. Never-written and trimmed bytes read as zeros; a
    /// checksum mismatch is an error, never wrong data.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        if self.buffered() {
            self.eng.dirty.read(&self.eng.log, &self.vol, offset, buf)?;
        } else {
            self.vol.read(&self.eng.log, offset, buf)?;
        }
        self.eng.log.counters().user_bytes_read.fetch_add(buf.len() as u64, SeqCst);
        Ok(())
    }

    /// [`Volume::read`] if every byte is in memory (the read cache, the write buffer, a
    /// record not yet written): `Ok(true)` with `buf` filled. `Ok(false)` when some of it
    /// would need a device read; then nothing was read or counted and `buf` is garbage. A
    /// front-end answers the first kind at once, on the thread that received the request,
    /// and hands the second to a thread that may wait.
    pub fn read_from_memory(&self, offset: u64, buf: &mut [u8]) -> Result<bool> {
        let (read, cache_hits) = crate::log::memory_reads::memory_only(|| self.read(offset, buf));
        match read {
            Ok(()) => {
                self.eng.log.count_cache_hits(cache_hits);
                Ok(true)
            }
            Err(Error::NotInMemory) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes `data` at `offset`; durable after the next flush. Partial pages are
    /// read-modify-write.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_from(offset, data, None)
    }

    /// Writes `data` at `offset` like [`Volume::write`], but without waiting for its turn
    /// while user writes are paced (`crate::pacing`): returns the instant before which the
    /// write must not be acknowledged to its client (`None`: at once). For a front-end that
    /// keeps many writes in flight on one thread: it holds each acknowledgement until its
    /// time instead of a thread sleeping per write, and a client that waits for
    /// acknowledgements before it writes more is held to the pacer's rate all the same.
    pub fn write_with_ack_time(&self, offset: u64, data: &[u8]) -> Result<Option<Instant>> {
        self.check_write(offset, data.len())?;
        let ack_at = self.eng.admit_user_write(data.len() as u64);
        self.write_unpaced(offset, data, None)?;
        self.count_written(data.len());
        Ok(ack_at)
    }

    /// A buffer to receive a write's payload of `len` bytes into, for
    /// [`Volume::write_payload`]; `None` when `len` is outside the sizes worth it or the pool's
    /// budget of such buffers is spent (then write through [`Volume::write`]).
    pub fn payload_buffer(&self, len: usize) -> Option<WriteBuffer> {
        self.eng.log.payloads().get(len)
    }

    /// Writes `payload` at `offset`, like [`Volume::write`], except that the records its whole
    /// pages go to hold them in the payload rather than copying them (zero-copy). The buffer
    /// goes back to its pool once no record holds it.
    pub fn write_payload(&self, offset: u64, payload: WriteBuffer) -> Result<()> {
        if self.buffered() {
            // The write buffer keeps its own copies of the pages.
            return self.write_from(offset, &payload, None);
        }
        let payload = Arc::new(payload);
        self.write_from(offset, &payload, Some(&payload))
    }

    /// Write-buffer pages to receive a write of `len` bytes at `offset` into, for
    /// [`Volume::write_paged`]: buffering it then copies nothing. `None` unless the volume's
    /// writes are buffered and the write is whole pages the buffer takes (page-aligned, at most
    /// a quarter of its capacity); the range is checked by `write_paged`.
    pub fn paged_payload(&self, offset: u64, len: usize) -> Option<PagedPayload> {
        if !self.buffered() {
            return None;
        }
        self.eng.dirty.paged_payload(&*self.vol, offset, len)
    }

    /// Writes `payload` at its offset, like [`Volume::write`] of its bytes; its pages become
    /// the buffered copies.
    pub fn write_paged(&self, payload: PagedPayload) -> Result<()> {
        let (offset, len) = (payload.offset(), payload.len());
        if !self.buffered() || !payload.has_pages_of(self.page_bytes() as usize) || self.passes_buffer() {
            // A payload made by another volume (of another page size, or one that does not
            // buffer): its pages cannot be this volume's, so its bytes are written. Or the
            // writers flush after every write.
            return self.write(offset, &payload.to_vec());
        }
        self.checked_write(offset, len, || self.eng.dirty.write_paged(&self.eng.log, &self.vol, payload))
    }

    /// [`Volume::write_paged`] if it needs no wait: [`WrittenNow::Written`] once the pages are
    /// buffered, [`WrittenNow::NotNow`] with nothing written when the write buffer would first
    /// have to make room (or the volume does not buffer writes): then write it with
    /// [`Volume::write_paged`] on a thread that may wait. A front-end runs it on the thread
    /// that received the write, as it does [`Volume::read_from_memory`]. While user writes are
    /// paced the write is not held for its turn either: the answer says when it may be
    /// acknowledged, as [`Volume::write_with_ack_time`]'s does.
    pub fn write_paged_now(&self, payload: PagedPayload) -> Result<WrittenNow> {
        let (offset, len) = (payload.offset(), payload.len());
        if !self.buffered() || !payload.has_pages_of(self.page_bytes() as usize) || self.passes_buffer() {
            return Ok(WrittenNow::NotNow(payload));
        }
        self.check_write(offset, len)?;
        if let Some(payload) = self.eng.dirty.write_paged_now(&self.eng.log, &self.vol, payload)? {
            return Ok(WrittenNow::NotNow(payload));
        }
        self.count_written(len);
        // Paced or not, the pacer measures the write and corrects its rate when that is due:
        // a server whose write buffer holds the working set sends every write this way.
        let ack_at = self.eng.admit_user_write(len as u64);
        Ok(WrittenNow::Written { ack_at })
    }

    /// [`Volume::write`] of `data`, which is all of `payload` when one is given.
    fn write_from(&self, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()> {
        self.checked_write(offset, data.len(), || self.write_unpaced(offset, data, payload))
    }

    /// Writes `data` (all of `payload` when one is given) at `offset`, checked and paced by
    /// the caller.
    fn write_unpaced(&self, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()> {
        if !self.buffered() {
            self.vol.write(&self.eng.log, offset, data, payload)
        } else if self.passes_buffer() {
            self.eng.dirty.write_through(&self.eng.log, &self.vol, offset, data)
        } else {
            self.eng.dirty.write(&self.eng.log, &self.vol, offset, data)
        }
    }

    /// Runs `write` of `len` bytes at `offset` once the range and the pool are checked, and
    /// counts its bytes.
    fn checked_write(&self, offset: u64, len: usize, write: impl FnOnce() -> Result<()>) -> Result<()> {
        self.check_write(offset, len)?;
        self.eng.pace_user_write(len as u64);
        write()?;
        self.count_written(len);
        Ok(())
    }

    /// Refuses a write of `len` bytes at `offset` outside the volume, or to a pool that no
    /// longer takes writes.
    fn check_write(&self, offset: u64, len: usize) -> Result<()> {
        self.check(offset, len as u64)?;
        self.eng.log.check_writable()
    }

    fn count_written(&self, len: usize) {
        self.eng.log.counters().user_bytes_written.fetch_add(len as u64, SeqCst);
        self.eng.log.note_user_write();
    }

    /// Writes and makes the write durable before returning (FUA).
    pub fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        if self.buffered() {
            // Past the buffer, and only this write's log records made durable.
            self.checked_write(offset, data.len(), || {
                self.eng.dirty.write_through(&self.eng.log, &self.vol, offset, data)
            })?;
            return self.eng.log.flush_volume(self.vol.id());
        }
        self.write(offset, data)?;
        self.eng.log.flush_volume(self.vol.id())
    }

    /// Whether this volume's writes go through the pool's write buffer.
    fn buffered(&self) -> bool {
        self.eng.dirty.buffers(&*self.vol)
    }

    /// Whether writes pass the write buffer although the volume has one: its writers flush
    /// after every write, so a buffered page would be destaged by the next flush anyway, and
    /// written ahead before it (see [`crate::engine::Engine::write_behind`]); writing it to
    /// the controller at once spares the buffer's work for nothing.
    fn passes_buffer(&self) -> bool {
        self.eng.log.writers_flush_every_write()
    }

    /// Discards whole pages inside the range (they read as zeros); partial pages at the edges
    /// are left as they are, as TRIM is advisory.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        self.eng.log.check_writable()?;
        if self.buffered() {
            return self
                .eng
                .dirty
                .trim(&self.eng.log, &self.vol, offset, len, || self.vol.trim(&self.eng.log, offset, len));
        }
        self.vol.trim(&self.eng.log, offset, len)
    }

    /// Makes the range read as zeros: whole pages are trimmed, partial pages are rewritten
    /// (unless they hold no data, which already reads as zeros). Needs no new space.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        self.eng.log.check_writable()?;
        if self.vol.kind() == ControllerKind::Amf {
            // An append-only volume cannot punch holes: the zeros are appended like any write
            // (and refused like one where the write point is elsewhere).
            let zeros = vec![0u8; len.min(1 << 20) as usize];
            let mut at = offset;
            while at < offset + len {
                let n = (offset + len - at).min(zeros.len() as u64);
                self.write(at, &zeros[..n as usize])?;
                at += n;
            }
            return Ok(());
        }
        let pb = self.vol.page_bytes() as u64;
        let (first_full, end_full) = (offset.div_ceil(pb) * pb, (offset + len) / pb * pb);
        let zero_part = |from: u64, to: u64| -> Result<()> {
            if to > from && self.is_mapped(from) {
                self.write(from, &vec![0u8; (to - from) as usize])?;
            }
            Ok(())
        };
        if end_full <= first_full {
            // Inside one page, or straddling two without covering either.
            let mid = (offset / pb + 1) * pb;
            zero_part(offset, mid.min(offset + len))?;
            return zero_part(mid, offset + len);
        }
        zero_part(offset, first_full)?;
        self.trim(first_full, end_full - first_full)?;
        zero_part(end_full, offset + len)
    }

    /// Remaps a batch of ranges without copying data (SHARE): afterwards each destination
    /// range reads what its source range read before the batch. Ranges are whole pages, inside
    /// the volume, with destinations that do not overlap; sources may overlap anything. The
    /// batch is atomic across crashes (all of it or none of it after a crash) and ordered like a
    /// write: durable at the next flush. Limits: [`MAX_SHARE_RANGES`] ranges, and entries that
    /// fit one record (a range whose source was written sequentially is one entry; one whose
    /// source is scattered takes one per piece); a page has at most [`MAX_SHARE_OWNERS`]
    /// owners. A bad batch is refused whole (`InvalidArgument`) with nothing changed. Only
    /// page-mapped volumes (`lsa`, `extent`, `dual`: whole large pages) share.
    pub fn share(&self, ranges: &[ShareRange]) -> Result<()> {
        if self.vol.is_retired() {
            return Err(Error::VolumeNotFound(self.vol.name().to_string()));
        }
        self.eng.log.check_writable()?;
        let pb = self.vol.page_bytes() as u64;
        let mut remaps = Vec::with_capacity(ranges.len());
        for r in ranges {
            if r.dst_offset % pb != 0 || r.src_offset % pb != 0 || r.len_bytes % pb != 0 {
                return Err(Error::InvalidArgument(format!(
                    "share of {} bytes from {} to {}: ranges must be whole pages of {pb} bytes on volume {:?}",
                    r.len_bytes,
                    r.src_offset,
                    r.dst_offset,
                    self.vol.name()
                )));
            }
            self.check(r.dst_offset, r.len_bytes)?;
            self.check(r.src_offset, r.len_bytes)?;
            remaps.push(crate::controller::lsa::PageRemap {
                dst: r.dst_offset / pb,
                src: r.src_offset / pb,
                pages: r.len_bytes / pb,
            });
        }
        if self.buffered() {
            // Every write that returned before the batch reaches the map first.
            return self
                .eng
                .dirty
                .write_down_volume(&self.eng.log, &self.vol, || self.vol.share(&self.eng.log, &remaps));
        }
        self.vol.share(&self.eng.log, &remaps)
    }

    /// [`Volume::share`], durable when it returns.
    pub fn share_fua(&self, ranges: &[ShareRange]) -> Result<()> {
        self.share(ranges)?;
        self.eng.flush()
    }

    /// An append-only (AMF) volume's segment size; `None` for any other volume.
    pub fn segment_bytes(&self) -> Option<u64> {
        self.vol.segment_bytes()
    }

    /// An append-only volume: bytes written into `segment` from its start (its write point).
    pub fn write_point(&self, segment: u64) -> Result<u64> {
        if self.vol.is_retired() {
            return Err(Error::VolumeNotFound(self.vol.name().to_string()));
        }
        self.vol.write_point(segment)
    }

    /// An append-only volume: writes `data` (whole pages) at `segment`'s write point and
    /// returns the volume offset it went to; refused (`AppendOnly`) when it does not fit.
    /// Appenders of one segment are serialised, so none is refused for racing another.
    pub fn append(&self, segment: u64, data: &[u8]) -> Result<u64> {
        self.eng.log.check_writable()?;
        let offset = self.vol.append(&self.eng.log, segment, data)?;
        self.eng.log.counters().user_bytes_written.fetch_add(data.len() as u64, SeqCst);
        Ok(offset)
    }

    /// Makes every write to this volume that returned before this call durable (its pages in
    /// the write buffer go down to its controller first). Other volumes' writes are left to
    /// their own flushes, as two disks each flush their own cache ([`Pool::flush`] flushes
    /// them all).
    pub fn flush(&self) -> Result<()> {
        if self.buffered() {
            self.eng.dirty.write_down_volume(&self.eng.log, &self.vol, || Ok(()))?;
        }
        self.eng.log.flush_volume(self.vol.id())
    }

    /// Write-behind (see `crate::engine::Engine::write_behind`): a front-end calls it after
    /// answering a write when no other request of its client is under way.
    pub fn write_behind(&self) -> Result<()> {
        self.eng.write_behind()
    }

    /// Whether the pool's writers have lately flushed after every write (the signal that
    /// turns write-behind on): a client that does so sends nothing more until its write is
    /// answered.
    pub fn writers_flush_every_write(&self) -> bool {
        self.eng.log.writers_flush_every_write()
    }

    /// Physical grain holding page `page`, `None` when it reads as zeros (never written or
    /// trimmed).
    pub fn page_location(&self, page: u64) -> Option<u64> {
        self.vol.page_location(page)
    }

    /// Pages in the volume.
    pub fn pages(&self) -> u64 {
        self.vol.size_bytes() / self.vol.page_bytes() as u64
    }

    /// Whether the page holding `offset` is mapped to data (for block-status queries).
    pub fn is_mapped(&self, offset: u64) -> bool {
        let page = offset / self.vol.page_bytes() as u64;
        self.page_location(page).is_some() || (self.buffered() && self.eng.dirty.holds(self.vol.id(), page))
    }
}
