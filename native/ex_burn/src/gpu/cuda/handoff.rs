//! Ordering work between cubecl's CUDA stream and a vendor library's stream on the device,
//! without the host waiting for either.
//!
//! Why: cubecl keeps its CUDA streams private, so a cuBLAS call cannot be put on the stream
//! whose kernels produce its inputs and consume its output. Ordering them from the host (wait for
//! cubecl's queue, run cuBLAS, wait for its stream) left the GPU idle for the host's whole round
//! trip on every product.
//!
//! How: two words of device memory per call (a slot of a per-device ring) carry the order.
//! * `signal` is a one-thread cubecl kernel bound to the inputs, so cubecl queues it after their
//!   producers (on its stream, and behind events for producers on its other streams); it stores
//!   the call's sequence number in the slot's first word.
//! * The vendor stream waits on the device for that word (`cuStreamWaitValue32`), runs the
//!   library call and writes the sequence number into the second word (`cuStreamWriteValue32`,
//!   which fences the call's writes before it).
//! * `wait` is a one-thread cubecl kernel bound to the inputs and the output that spins until the
//!   second word holds the number, and rewrites one element of the output as it stands: cubecl
//!   then sees the output written, and the inputs read, by a kernel that ends after the library
//!   call, so every consumer, and every reuse of the inputs' memory, is ordered after it by
//!   cubecl's own tracking.
//!
//! Neither kernel runs until everything before it on its stream has, and the vendor stream's wait
//! is enqueued only after `signal` was flushed to the device, so the chain cannot wait on work
//! that was never submitted. The spin is bounded (20 s, plus time for the call's work at 0.1
//! TFLOP/s) so that a bug here could not hang the GPU for good. Where the driver refuses stream memory operations
//! the caller falls back to waiting on the host ([`Handoff::begin`] returns `None`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use cubecl::prelude::*;
use cudarc::driver::sys;

/// Slots in a device's ring: a slot is reused after this many calls, long after its last one
/// finished.
const SLOTS: usize = 1024;
/// Spin bound of `wait` for a call of no work: 2^27 atomic loads, about 20 s at a GPU's L2
/// latency of ~150 ns.
const SPIN_BASE: u64 = 1 << 27;
/// Further spins per unit of the call's work (flops): as long as the card does more than about
/// 0.1 TFLOP/s, a call ends before its wait gives up.
const FLOPS_PER_SPIN: u64 = 1 << 14;

#[cube(launch)]
fn vendor_signal(flags: &[Atomic<u32>], _a: &[u16], _b: &[u16], slot: u32, seq: u32) {
    if UNIT_POS == 0 {
        // the inputs' producers finished before this kernel started (stream order); publish it
        sync_storage();
        flags[(2 * slot) as usize].store(seq);
    }
}

#[cube(launch)]
fn vendor_wait(flags: &[Atomic<u32>], a: &[u16], b: &[u16], out: &mut [u16], slot: u32, seq: u32, limit: u32) {
    if UNIT_POS == 0 {
        let mut spins = 0u32;
        while flags[(2 * slot + 1) as usize].load() != seq && spins < limit {
            spins += 1u32;
        }
        // acquire: the library's writes (fenced before the flag) are visible from here
        sync_storage();
        // a write of the output and (never taken, but not provably so) reads of the inputs, so
        // that cubecl's read/write tracking, which follows what a kernel's code touches, orders
        // the output's consumers and the inputs' next writers after this kernel
        let mut keep = out[0];
        if spins > limit {
            keep = a[0] ^ b[0];
        }
        out[0] = keep;
    }
}

use super::CudaServer;
type Client = cubecl_runtime::client::Client;
type Pinned = cubecl_runtime::storage::ManagedResource<
    <<CudaServer as cubecl_runtime::server::ServerStorage>::Storage as cubecl_runtime::storage::ComputeStorage>::Resource,
>;

struct Ring {
    handle: cubecl::server::Handle,
    /// device address of the ring; the held resource keeps it from moving or being reused
    ptr: u64,
    _pinned: Pinned,
}

fn ring(client: &Client, index: usize) -> Result<(cubecl::server::Handle, u64), String> {
    static RINGS: OnceLock<Mutex<HashMap<usize, Ring>>> = OnceLock::new();
    let mut rings = RINGS.get_or_init(Default::default).lock().map_err(|_| "handoff ring lock poisoned")?;
    if let Some(r) = rings.get(&index) {
        return Ok((r.handle.clone(), r.ptr));
    }
    let handle = client.create_from_slice(&vec![0u8; SLOTS * 2 * 4]);
    let pinned = client.get_resource::<CudaServer>(handle.clone()).map_err(|e| format!("{e:?}"))?;
    // the zeros must be on the device before any wait reads them
    cubecl::future::block_on(client.sync()).map_err(|e| format!("{e:?}"))?;
    let ptr = pinned.resource().ptr;
    rings.insert(index, Ring { handle: handle.clone(), ptr, _pinned: pinned });
    Ok((handle, ptr))
}

/// One library call's place in cubecl's order, between [`Handoff::begin`] and [`Handoff::end`].
pub struct Handoff {
    ring: cubecl::server::Handle,
    ptr: u64,
    slot: u32,
    seq: u32,
}

fn next_seq() -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    loop {
        let s = SEQ.fetch_add(1, Ordering::Relaxed);
        // 0 is the ring's initial value: never a sequence number
        if s != 0 {
            return s;
        }
    }
}

/// `EXBURN_CUBLAS_HOST_SYNC=1` orders vendor calls from the host instead (for comparison).
fn enabled() -> bool {
    !crate::process::env::cublas_host_sync()
}

fn buffer(h: &cubecl::server::Handle, bytes: usize) -> BufferArg {
    // SAFETY: the kernels touch element 0 only, and every buffer here holds at least one u16
    unsafe { BufferArg::from_raw_parts(h.clone(), (bytes / 2).max(1)) }
}

impl Handoff {
    /// Queue `signal` after the inputs' producers and make `stream` wait for it on the device.
    /// `None` (nothing queued) where this is switched off or the driver refuses the wait: the
    /// caller then orders the call from the host.
    pub fn begin(
        client: &Client,
        index: usize,
        stream: sys::CUstream,
        inputs: [(&cubecl::server::Handle, usize); 2],
    ) -> Option<Handoff> {
        if !enabled() {
            return None;
        }
        let (ring, ptr) = ring(client, index).ok()?;
        let seq = next_seq();
        let slot = seq % SLOTS as u32;
        vendor_signal::launch(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            buffer(&ring, SLOTS * 8),
            buffer(inputs[0].0, inputs[0].1),
            buffer(inputs[1].0, inputs[1].1),
            slot,
            seq,
        );
        // on the device before the vendor stream waits for it
        client.flush().ok()?;
        let addr = ptr + (2 * slot as u64) * 4;
        // SAFETY: `addr` lies in the ring, pinned for the process; EQ: the slot's next value is
        // this call's number (slots are reused SLOTS calls later)
        let queued = unsafe { sys::cuStreamWaitValue32_v2(stream, addr, seq, sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32) };
        if queued != sys::CUresult::CUDA_SUCCESS {
            // `signal` still runs and stores into a slot nobody waits on: harmless
            return None;
        }
        Some(Handoff { ring, ptr, slot, seq })
    }

    /// After the library call (of `flops` floating-point operations) was queued on `stream`:
    /// publish its end there and queue `wait` on cubecl's side, bound to the inputs and the
    /// output.
    pub fn end(
        self,
        client: &Client,
        stream: sys::CUstream,
        inputs: [(&cubecl::server::Handle, usize); 2],
        output: (&cubecl::server::Handle, usize),
        flops: u64,
    ) -> Result<(), String> {
        let addr = self.ptr + (2 * self.slot as u64 + 1) * 4;
        // SAFETY: as in `begin`; the default flag fences the library call's writes before this
        let written = unsafe { sys::cuStreamWriteValue32_v2(stream, addr, self.seq, 0) };
        if written != sys::CUresult::CUDA_SUCCESS {
            // the call is queued but its end cannot be published: wait for it here instead, so
            // that it is complete before anything later is queued
            // SAFETY: a live stream of this context
            return unsafe { sys::cuStreamSynchronize(stream) }.result().map_err(|e| format!("{e:?}"));
        }
        vendor_wait::launch(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            buffer(&self.ring, SLOTS * 8),
            buffer(inputs[0].0, inputs[0].1),
            buffer(inputs[1].0, inputs[1].1),
            buffer(output.0, output.1),
            self.slot,
            self.seq,
            (SPIN_BASE + flops / FLOPS_PER_SPIN).min(u32::MAX as u64) as u32,
        );
        Ok(())
    }
}
