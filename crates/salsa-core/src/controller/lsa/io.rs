//! The LSA controller's byte-addressed front-end ([`VolumeIo`]): requests are split into whole
//! pages, which go down in runs, and partial pages at either end, which are read-modify-write
//! under the page's read-modify-write lock.
//!
//! Every request holds the volume's gate shared, and checks that the volume was not retired
//! (deleted) after taking it, so no request runs on a volume once deletion has begun.

use super::LsaVolume;
use crate::controller::map::Entry;
use crate::controller::{page_pieces, VolumeIo};
use crate::error::{Error, Result};
use crate::format::ControllerKind;
use crate::log::payload::WriteBuffer;
use crate::log::Log;
use parking_lot::RwLockReadGuard;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

impl LsaVolume {
    /// Takes the gate shared and refuses a retired volume.
    pub(crate) fn enter(&self) -> Result<RwLockReadGuard<'_, ()>> {
        let gate = self.gate.read();
        if self.deleted.load(SeqCst) {
            return Err(Error::VolumeNotFound(self.name.clone()));
        }
        Ok(gate)
    }
}

impl VolumeIo for LsaVolume {
    fn kind(&self) -> ControllerKind {
        self.kind
    }

    fn size_bytes(&self) -> u64 {
        LsaVolume::size_bytes(self)
    }

    fn page_bytes(&self) -> u32 {
        self.page_bytes
    }

    fn mapped_bytes(&self) -> u64 {
        self.mapped_pages.load(SeqCst) * self.page_bytes as u64
    }

    fn read(&self, log: &Log, offset: u64, buf: &mut [u8]) -> Result<()> {
        let _gate = self.enter()?;
        let map = self.map();
        let pb = self.page_bytes as usize;
        let mut tmp = Vec::new();
        let mut done = 0;
        // Whole pages are read in runs (see `read_pages`); partial ones at either end alone.
        let mut run: Option<(u64, usize)> = None; // (first page, offset in `buf`)
        for (page, in_page, n) in page_pieces(offset, buf.len() as u64, self.page_bytes) {
            if n == pb {
                run.get_or_insert((page, done));
            } else {
                if let Some((first, at)) = run.take() {
                    self.read_pages(log, &map, first, &mut buf[at..done])?;
                }
                tmp.resize(pb, 0);
                self.read_page(log, &map, page, &mut tmp)?;
                buf[done..done + n].copy_from_slice(&tmp[in_page..in_page + n]);
            }
            done += n;
        }
        if let Some((first, at)) = run {
            self.read_pages(log, &map, first, &mut buf[at..done])?;
        }
        Ok(())
    }

    fn write(&self, log: &Log, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()> {
        let _gate = self.enter()?;
        let map = self.map();
        let pb = self.page_bytes as usize;
        if !data.is_empty() {
            let first = offset / pb as u64;
            let last = (offset + data.len() as u64 - 1) / pb as u64;
            self.check_space(log, &map, first..last + 1)?;
        }
        let mut done = 0;
        // Whole pages go down in runs (one call for all the whole pages of the request); only
        // the partial pages at either end are read-modify-write.
        let mut run: Option<(u64, usize)> = None; // (first page, offset in `data`)
        for (page, in_page, n) in page_pieces(offset, data.len() as u64, self.page_bytes) {
            if n == pb {
                run.get_or_insert((page, done));
            } else {
                if let Some((first, at)) = run.take() {
                    self.write_pages(log, &map, first, &data[at..done], payload.map(|p| (p, at)))?;
                }
                let _rmw = self.rmw_lock(page).lock();
                let mut tmp = vec![0u8; pb];
                self.read_page(log, &map, page, &mut tmp)?;
                tmp[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
                self.write_pages(log, &map, page, &tmp, None)?;
            }
            done += n;
        }
        if let Some((first, at)) = run {
            self.write_pages(log, &map, first, &data[at..done], payload.map(|p| (p, at)))?;
        }
        Ok(())
    }

    fn trim(&self, log: &Log, offset: u64, len: u64) -> Result<()> {
        let _gate = self.enter()?;
        let pb = self.page_bytes as u64;
        let first = offset.div_ceil(pb);
        let end = (offset + len) / pb;
        if end > first {
            let map = self.map();
            self.trim_pages(log, &map, first, end - first, &|_| false)?;
        }
        Ok(())
    }

    fn page_location(&self, page: u64) -> Option<u64> {
        let map = self.map();
        match (page < map.pages()).then(|| map.load(page)) {
            Some(Entry::Mapped(g)) => Some(g),
            _ => None,
        }
    }

    fn grow(&self, new_size_bytes: u64) -> Result<()> {
        LsaVolume::grow(self, new_size_bytes);
        Ok(())
    }

    fn retire(&self) {
        let _gate = self.gate.write();
        self.deleted.store(true, SeqCst);
    }

    fn is_retired(&self) -> bool {
        self.deleted.load(SeqCst)
    }

    fn mapped_grains(&self) -> u64 {
        self.data_grains()
    }

    fn share(&self, log: &Log, remaps: &[super::PageRemap]) -> Result<()> {
        let _gate = self.enter()?;
        self.share_pages(log, remaps)
    }
}
