//! An embedding does not depend on the texts that share its call: rows of equal token count run
//! together without padding, and each comes out bit for bit as it does alone, on both engines
//! (the guarantee `ExBurn.Embedding` and the serving Batcher document); on Burn on the CPU rows of
//! any lengths do. Checked on the installed all-MiniLM-L6-v2 and on the tiny encoders in
//! `test/data/encoders/`.

use std::path::{Path, PathBuf};

use super::weights::test_support::minilm_dir;
use super::{EmbeddingModel, Engine};
use crate::device::DeviceRef;

const TEXT: &str = "A quick brown fox jumps over the lazy dog near the quiet river bank at dawn";

/// `n` rows of `ids`' length: `ids` itself first, then its inner tokens (between the first and
/// last, the special tokens) rotated, so each row differs in content and none in length.
fn same_length_rows(ids: &[u32], n: usize) -> Vec<Vec<u32>> {
    let inner = &ids[1..ids.len() - 1];
    (0..n)
        .map(|r| {
            let mut row = vec![ids[0]];
            row.extend(inner.iter().cycle().skip(r % inner.len().max(1)).take(inner.len()));
            row.push(ids[ids.len() - 1]);
            row
        })
        .collect()
}

/// Each row embedded alone equals its embedding inside batches of 2, 5 and 32 equal-length rows,
/// for sequences of a few tokens to a few dozen (both sides of any row-count threshold).
fn alone_equals_batched(dir: &Path, engine: Engine) {
    let model = EmbeddingModel::load(dir, engine, DeviceRef::CPU).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let full = model.tokenize(&[format!("{TEXT}, {TEXT}")]).unwrap().remove(0);
    let mut checked = 0;
    for len in [5, 13, 24, 25, 40] {
        let len = len.min(full.len());
        let mut ids = full[..len - 1].to_vec();
        ids.push(full[full.len() - 1]);
        for n in [2, 5, 32] {
            let rows = same_length_rows(&ids, n);
            let together = model.embed_ids(&rows).unwrap();
            for i in [0, n / 2, n - 1] {
                let alone = model.embed_ids(&rows[i..i + 1]).unwrap().remove(0);
                let worst = alone.iter().zip(&together[i]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(
                    alone == together[i],
                    "{} on {engine:?}: row {i} of {n} rows of {len} tokens differs from alone (by up to {worst:e})",
                    dir.display()
                );
                checked += 1;
            }
        }
    }
    println!("{} on {}: {checked} rows identical alone and in batches of equal length", dir.display(), engine.name());
}

/// On the Burn engine on the CPU rows of different lengths may share a call too: only their
/// real tokens go through the dense layers, and each text attends over its own tokens
/// (`encoder_attention`), so a padded batch gives each row its bits alone.
fn mixed_lengths_equal_alone(dir: &Path) {
    let model = EmbeddingModel::load(dir, Engine::Burn, DeviceRef::CPU).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let full = model.tokenize(&[format!("{TEXT}, {TEXT}")]).unwrap().remove(0);
    let rows: Vec<Vec<u32>> = [5, 40, 13, 2, 25, 24]
        .iter()
        .map(|&len| {
            let mut ids = full[..len.min(full.len()) - 1].to_vec();
            ids.push(full[full.len() - 1]);
            ids
        })
        .collect();
    let together = model.embed_ids(&rows).unwrap();
    for (i, row) in rows.iter().enumerate() {
        let alone = model.embed_ids(std::slice::from_ref(row)).unwrap().remove(0);
        assert!(alone == together[i], "{}: row {i} ({} tokens) differs from alone", dir.display(), row.len());
    }
    println!("{} on burn: {} rows of 2 to 40 tokens identical alone and in one padded batch", dir.display(), rows.len());
}

#[test]
fn burn_rows_of_mixed_lengths_equal_alone() {
    let mut dirs = tiny_encoders();
    dirs.push(tiny_encoders()[0].with_file_name("tiny-nomic-bert-mean"));
    dirs.extend(minilm_dir());
    for dir in dirs {
        mixed_lengths_equal_alone(&dir);
    }
}

fn tiny_encoders() -> Vec<PathBuf> {
    let root = crate::process::env::reference_dir().parent().expect("reference dir has a parent").join("encoders");
    ["tiny-bert-lasttoken-dense", "tiny-bert-max-weightedmean", "tiny-xlm-roberta-cls", "tiny-mpnet-mean"].iter().map(|n| root.join(n)).collect()
}

#[test]
fn minilm_embedding_alone_equals_batched_on_burn() {
    let Some(dir) = minilm_dir() else { return };
    alone_equals_batched(&dir, Engine::Burn);
}

#[test]
fn minilm_embedding_alone_equals_batched_on_candle() {
    let Some(dir) = minilm_dir() else { return };
    alone_equals_batched(&dir, Engine::Candle);
}

#[test]
fn tiny_encoder_embedding_alone_equals_batched_on_both_engines() {
    for dir in tiny_encoders() {
        alone_equals_batched(&dir, Engine::Burn);
        alone_equals_batched(&dir, Engine::Candle);
    }
}
