//! Kernels of our own, apart from Nx's semantics (`crate::ops` decides what to compute and calls
//! these where they cover the case, keeping Burn's path as the fallback).

pub mod cpu;
