//! [`VolumeSpec`]: what a new volume is (its controller kind, page size, policies and the
//! controller's own settings), as the pool's volume table records it and
//! [`super::settings_for`] turns it into a controller's settings. A controller-level
//! description, so that the controllers never reach up into the pool for it.

use crate::format::ControllerKind;

/// What a new volume is: its controller, page size and policies.
#[derive(Debug, Clone)]
pub struct VolumeSpec {
    pub controller: ControllerKind,
    /// The unit of mapping (for the dual-mapping controller, the large pages of its dense
    /// map; its sparse map holds grain-sized pages).
    pub page_bytes: u32,
    /// Placement policy; `None`: the pool's default.
    pub placement: Option<String>,
    /// Victim policy ranking the volume's segments; `None`: the pool's.
    pub victim: Option<String>,
    /// Dual mapping: most small pages the sparse map holds; `None`: the default for the
    /// volume's size ([`super::dual::default_sparse_pages`]).
    pub sparse_pages: Option<u64>,
    /// Hybrid: group size, fast-tier bound, promotion rate, temperature half-life.
    pub hybrid: super::hybrid::HybridSpec,
    /// LSA and dual mapping: the storage types its data is written to (default any).
    pub storage: crate::log::StorageClass,
    /// AMF: the segment size; `None`: [`super::amf::default_segment_bytes`].
    pub segment_bytes: Option<u64>,
    /// AMF: user streams, segments written at once that never share a log segment (1 to 8;
    /// `None`: 1).
    pub segment_streams: Option<u8>,
    /// LSA: how pages are compressed (default off).
    pub compression: super::compression::Compression,
}

impl VolumeSpec {
    /// An LSA (page map) volume with the pool's policies.
    pub fn lsa(page_bytes: u32) -> VolumeSpec {
        VolumeSpec {
            controller: ControllerKind::Lsa,
            page_bytes,
            placement: None,
            victim: None,
            sparse_pages: None,
            hybrid: Default::default(),
            storage: Default::default(),
            segment_bytes: None,
            segment_streams: None,
            compression: Default::default(),
        }
    }

    /// An append-only (AMF) volume of `page_bytes` pages in segments of `segment_bytes`
    /// (`None`: the default for the pool).
    pub fn amf(page_bytes: u32, segment_bytes: Option<u64>) -> VolumeSpec {
        VolumeSpec {
            controller: ControllerKind::Amf,
            segment_bytes,
            ..VolumeSpec::lsa(page_bytes)
        }
    }

    /// A dual-mapping volume of `page_bytes` large pages with the pool's policies.
    pub fn dual(page_bytes: u32) -> VolumeSpec {
        VolumeSpec {
            controller: ControllerKind::Dual,
            ..VolumeSpec::lsa(page_bytes)
        }
    }

    /// A hybrid volume of `page_bytes` pages with the pool's policies and default tiering.
    pub fn hybrid(page_bytes: u32) -> VolumeSpec {
        VolumeSpec {
            controller: ControllerKind::Hybrid,
            ..VolumeSpec::lsa(page_bytes)
        }
    }
}
