//! The JSON form of a pool's statistics, as `salsa stats --json`, the control socket, the
//! metrics endpoint and the Python bindings give it: one shape everywhere.

/// The statistics as one JSON object.
pub fn stats_json(pool: &salsa_core::Pool) -> serde_json::Value {
    let s = pool.stats();
    let mut j = serde_json::json!({
        "user_bytes_written": s.user_bytes_written,
        "user_bytes_read": s.user_bytes_read,
        "gc_bytes_relocated": s.gc_bytes_relocated,
        "device_bytes_written": s.device_bytes_written,
        "metadata_bytes_written": s.metadata_bytes_written,
        "write_amplification": s.write_amplification,
        "gc_write_amplification": s.gc_write_amplification,
        "free_segments": s.free_segments,
        "total_segments": s.total_segments,
        "segment_bytes": s.segment_bytes,
        "gc_segments_cleaned": s.gc_segments_cleaned,
        "flushes": s.flushes,
        "syncs": s.syncs,
        "throttled_allocations": s.throttled_allocations,
        "unmovable_segments": s.unmovable_segments,
        "gc_wait_timeouts": s.gc_wait_timeouts,
        "user_bytes_held": s.user_bytes_held,
        "compressed_bytes_saved": s.compressed_bytes_saved,
        "payload_buffer_bytes": s.payload_buffer_bytes,
        "map_memory_bytes": s.map_memory_bytes,
        "crc_table_memory_bytes": s.crc_table_memory_bytes,
        "device_counters": s.device_counters.iter().map(|(device, counter, value)| serde_json::json!({
            "device": device, "counter": counter, "value": value,
        })).collect::<Vec<_>>(),
        "array": s.array,
        "rebuild": s.rebuild.map(|r| serde_json::json!({
            "slot": r.slot, "next_segment": r.next_segment, "total_segments": r.total_segments,
            "rate_bytes_per_sec": r.rate_bytes_per_sec,
        })),
        "pad_bytes_written": s.pad_bytes_written,
        "discarded_bytes": s.discarded_bytes,
        "gc_bursts": s.gc_bursts,
        "gc_burst_records": s.gc_burst_records,
        "discard_errors": s.discard_errors,
        "discards_skipped": s.discards_skipped,
        "parity_buffer": s.parity_buffer.as_ref().map(|b| serde_json::json!({
            "name": b.name, "size_bytes": b.size_bytes, "rows_per_bank": b.rows_per_bank,
            "banks_written": b.banks_written, "bytes_written": b.bytes_written, "banks_skipped": b.banks_skipped,
            "failed": b.failed,
        })),
        "read_cache": s.read_cache.map(|c| serde_json::json!({
            "capacity_bytes": c.capacity_bytes, "used_bytes": c.used_bytes, "pages": c.pages,
            "hits": c.hits, "misses": c.misses, "damaged_hits": c.damaged_hits,
        })),
        "array_write_amplification": s.array_write_amplification,
        "members": s.members.iter().map(member_json).collect::<Vec<_>>(),
        "volumes": s.volumes.iter().map(volume_json).collect::<Vec<_>>(),
    });
    // Outside the macro, whose recursion limit the object above has reached.
    j["pages_shared"] = s.pages_shared.into();
    j["share_batches"] = s.share_batches.into();
    j["records_written_ahead"] = s.records_written_ahead.into();
    j["hole_fill_bytes"] = s.hole_fill_bytes.into();
    j["free_segments_over_holes"] = s.free_segments_over_holes.into();
    j["gc_low_watermark_segments"] = s.gc_low_watermark_segments.into();
    j["gc_high_watermark_segments"] = s.gc_high_watermark_segments.into();
    j["sync_micros"] = s.sync_micros.into();
    j["releases_sharing_a_sync"] = s.releases_sharing_a_sync.into();
    j["gc_micros"] = s.gc_micros.into();
    j["gc_bytes_read"] = s.gc_bytes_read.into();
    j["paced_writes"] = s.paced_writes.into();
    j["paced_micros"] = s.paced_micros.into();
    j["pacing_rate_bytes_per_sec"] = s.pacing_rate_bytes_per_sec.into();
    j["paced_by_write_back"] = s.paced_by_write_back.into();
    j["victim_policy_state"] = victim_policy_state_json(&s.victim_policy_state);
    j["write_buffer"] = s
        .write_buffer
        .map(|w| {
            serde_json::json!({
                "capacity_bytes": w.capacity_bytes, "dirty_bytes": w.dirty_bytes, "dirty_pages": w.dirty_pages,
                "pages_written": w.pages_written, "pages_absorbed": w.pages_absorbed, "destages": w.destages,
                "pages_destaged": w.pages_destaged, "writer_waits": w.writer_waits, "reserved_bytes": w.reserved_bytes,
                "spare_bytes": w.spare_bytes,
            })
        })
        .unwrap_or(serde_json::Value::Null);
    j
}

/// What a victim policy reports of itself (`VictimPolicy::state`) as one JSON object, for
/// `salsa stats --json` and `salsa bench`'s results.
pub fn victim_policy_state_json(state: &[(String, f64)]) -> serde_json::Value {
    state
        .iter()
        .map(|(k, v)| (k.clone(), (*v).into()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// That object as one line of `name value` pairs (`salsa stats`, `salsa bench`); `None` when
/// the policy reports nothing.
pub fn victim_policy_state_text(state: &serde_json::Value) -> Option<String> {
    let state = state.as_object().filter(|m| !m.is_empty())?;
    let pairs: Vec<String> = state
        .iter()
        .map(|(k, x)| format!("{k} {}", x.as_f64().unwrap_or(f64::NAN)))
        .collect();
    Some(pairs.join(", "))
}

/// One volume's statistics, controller, policies and settings as JSON (sizes in bytes), for
/// `salsa stats --json` and `salsa volume list --json`.
pub fn volume_json(v: &salsa_core::VolumeStats) -> serde_json::Value {
    let settings: serde_json::Map<String, serde_json::Value> = v.settings.iter().map(|(k, v)| (k.clone(), (*v).into())).collect();
    let mut j = serde_json::json!({
        "name": v.name, "controller": v.controller, "size_bytes": v.size_bytes, "page_bytes": v.page_bytes,
        "mapped_bytes": v.mapped_bytes, "stored_bytes": v.stored_bytes, "compression": v.compression.name(),
        "map_memory_bytes": v.map_memory_bytes,
        "checkpoint_image_bytes": v.checkpoint_image_bytes, "storage": v.storage,
        "placement": v.placement, "placement_memory_bytes": v.placement_memory_bytes, "victim": v.victim,
        "gc_bytes_relocated": v.gc_bytes_relocated,
        "settings": settings,
    });
    if v.controller == "dual" {
        j["sparse_pages"] = v.sparse_pages.into();
        j["sparse_capacity_pages"] = v.sparse_capacity_pages.into();
        j["merged_pages"] = v.merged_pages.into();
        j["small_pages_written"] = v.small_pages_written.into();
    }
    if v.controller == "hybrid" {
        j["fast_tier_bytes"] = v.fast_tier_bytes.into();
        j["fast_tier_segments"] = v.fast_tier_segments.into();
        j["promotions"] = v.promotions.into();
        j["demotions"] = v.demotions.into();
        j["fast_read_bytes"] = v.fast_read_bytes.into();
        j["slow_read_bytes"] = v.slow_read_bytes.into();
        j["fast_tier_failed"] = v.fast_tier_failed.into();
    }
    if v.controller == "lsa" || v.controller == "extent" {
        j["shared_pages"] = v.shared_pages.into();
    }
    if v.controller == "amf" {
        j["segments"] = v.amf_segments.into();
        j["segments_written"] = v.amf_segments_written.into();
        j["segments_full"] = v.amf_segments_full.into();
        j["map_runs"] = v.map_runs.into();
    }
    j
}

/// One member's line of `stats --json`.
fn member_json(m: &salsa_core::MemberStatus) -> serde_json::Value {
    serde_json::json!({
        "name": m.name, "storage_type": m.storage_type, "state": m.state(), "outgoing": m.outgoing,
        "bytes_read": m.bytes_read, "bytes_written": m.bytes_written,
        "parity_bytes_written": m.parity_bytes_written, "read_errors": m.read_errors,
        "write_errors": m.write_errors, "repaired_bytes": m.repaired_bytes,
        "damaged_bytes": m.damaged_bytes,
    })
}
