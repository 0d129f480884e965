//! Weight readers for the Burn engine: safetensors (memory-mapped) and GGUF (read through
//! candle's parser, dequantised to f32).
//!
//! Both readers hand out one Burn f32 tensor at a time, so a model loads with at most one
//! tensor's transient copies beside the tensors already on the device. GGUF tensors are
//! dequantised in row chunks straight into the buffer the Burn tensor takes over.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use burn::tensor::{bf16, f16, DType, Device, Tensor, TensorData};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{ggml_file, GgmlDType};
use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};

use super::errors::{self, err, kind, path_detail};
use super::qmatmul::{QFormat, QMatrix};
use crate::kernels::cpu::quant::widen;
use crate::error::{Detail, ExError, ExResult};

fn io_error(path: &Path, e: std::io::Error) -> ExError {
    errors::io(path, e)
}

fn missing_tensor(path: &Path, name: &str) -> ExError {
    err(kind::MISSING_TENSOR, format!("tensor `{name}` is missing from {}", path.display()), vec![path_detail(path), ("tensor", Detail::Text(name.to_string()))])
}

/// Builds a vector of i32 indices (for `select`, `select_assign`) from host values.
pub fn i32_tensor(values: Vec<i32>, device: &Device) -> Tensor<1, burn::tensor::Int> {
    let n = values.len();
    Tensor::<1, burn::tensor::Int>::from_data(TensorData::new(values, [n]), (device, DType::I32))
}

/// Builds an f32 Burn tensor from host values. The `Vec` becomes the tensor's storage on the CPU.
pub fn f32_tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::<D>::from_data(TensorData::new(values, shape), (device, DType::F32))
}

fn check_shape(file: &Path, name: &str, got: &[usize], want: &[usize]) -> ExResult<()> {
    if got != want {
        return Err(err(
            kind::TENSOR_MISMATCH,
            format!("tensor `{name}` in {} has shape {got:?}, expected {want:?}", file.display()),
            vec![path_detail(file), ("tensor", Detail::Text(name.to_string())), ("shape", Detail::Dims(got.to_vec())), ("expected_shape", Detail::Dims(want.to_vec()))],
        ));
    }
    Ok(())
}

/// A memory-mapped `.safetensors` file whose header has been parsed and validated.
pub struct Safetensors {
    path: PathBuf,
    mmap: Mmap,
    header_len: usize,
    metadata: Metadata,
}

impl Safetensors {
    pub fn open(path: &Path) -> ExResult<Self> {
        let file = File::open(path).map_err(|e| io_error(path, e))?;
        // SAFETY: the map is read-only; a file truncated under us while mapped would fault, which
        // is the same contract every safetensors/mmap loader (candle, transformers) accepts.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_error(path, e))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            let (k, what) = match e {
                safetensors::SafeTensorError::MetadataIncompleteBuffer | safetensors::SafeTensorError::InvalidHeaderLength => {
                    (kind::TRUNCATED_FILE, "the file is truncated or its header length is wrong")
                }
                safetensors::SafeTensorError::HeaderTooSmall => (kind::TRUNCATED_FILE, "the file is too small to hold a header"),
                _ => (kind::CORRUPT_SAFETENSORS, "its header is corrupt"),
            };
            err(k, format!("cannot read safetensors file {}: {what} ({e})", path.display()), vec![path_detail(path)])
        })?;
        Ok(Safetensors { path: path.to_path_buf(), mmap, header_len, metadata })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn names(&self) -> Vec<String> {
        self.metadata.tensors().into_keys().collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.metadata.info(name).is_some()
    }

    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.metadata.info(name).map(|i| i.shape.clone())
    }

    /// Whether `name` holds float weights (`values` reads F32, F16 and BF16); checkpoints also
    /// carry integer buffers such as BERT's `position_ids`.
    pub fn is_float(&self, name: &str) -> bool {
        self.metadata.info(name).is_some_and(|i| matches!(i.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16))
    }

    /// The float type of `name`'s weights (F32, F16 or BF16), checked against `shape`.
    pub fn float_dtype(&self, name: &str, shape: &[usize]) -> ExResult<Dtype> {
        let info = self.metadata.info(name).ok_or_else(|| missing_tensor(&self.path, name))?;
        check_shape(&self.path, name, &info.shape, shape)?;
        match info.dtype {
            d @ (Dtype::F32 | Dtype::F16 | Dtype::BF16) => Ok(d),
            other => Err(err(
                kind::UNSUPPORTED_DTYPE,
                format!("tensor `{name}` in {} has dtype {other:?}; only F32, F16 and BF16 weights are supported", self.path.display()),
                vec![path_detail(&self.path), ("tensor", Detail::Text(name.to_string()))],
            )),
        }
    }

    /// The stored little-endian bytes of `name` (checked against `shape`) and their float type.
    pub fn raw(&self, name: &str, shape: &[usize]) -> ExResult<(Dtype, &[u8])> {
        let dtype = self.float_dtype(name, shape)?;
        let (start, end) = self.metadata.info(name).expect("checked above").data_offsets;
        let base = 8 + self.header_len;
        Ok((dtype, &self.mmap[base + start..base + end]))
    }

    /// The tensor `name` as f32 host values, checked against `shape`.
    pub fn values(&self, name: &str, shape: &[usize]) -> ExResult<Vec<f32>> {
        let dtype = self.float_dtype(name, shape)?;
        let (start, end) = self.metadata.info(name).expect("checked above").data_offsets;
        let base = 8 + self.header_len;
        let (width, convert): (usize, fn(&[u8]) -> f32) = match dtype {
            Dtype::F16 => (2, |c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
            Dtype::BF16 => (2, |c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            _ => (4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        };
        let mut values = Vec::with_capacity((end - start) / width);
        // Converted a few MiB at a time, each piece's file pages dropped from this process's
        // resident set once read: a load's peak is then the converted weights plus a few MiB,
        // whatever order the tensors come in (a tensor read whole stays resident twice, file and
        // floats, until the end, so the peak would depend on the order).
        const PIECE: usize = 4 << 20;
        let mut at = start;
        while at < end {
            let stop = end.min(at + PIECE);
            let bytes = &self.mmap[base + at..base + stop];
            values.extend(bytes.chunks_exact(width).map(convert));
            // SAFETY: no slice of these pages outlives this statement (`bytes` is dead); a
            // read-only file-backed page that is accessed again (a page shared with the next
            // piece) is simply read back from the file.
            #[cfg(unix)]
            unsafe {
                let _ = self.mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, base + at, stop - at);
            }
            at = stop;
        }
        Ok(values)
    }

    /// The tensor `name` as an f32 Burn tensor on `device`, checked against `shape`.
    pub fn tensor<const D: usize>(&self, name: &str, shape: [usize; D], device: &Device) -> ExResult<Tensor<D>> {
        Ok(f32_tensor(self.values(name, &shape)?, shape, device))
    }
}

/// GGUF quantisation types this reader dequantises. candle parses a few more (Q8_1 has no
/// dequantiser there) and rejects unknown type ids when reading the header.
fn dequantisable(t: GgmlDType) -> bool {
    !matches!(t, GgmlDType::Q8_1)
}

/// A GGUF file: its metadata and tensor directory, and the open file the tensors are read from.
pub struct Gguf {
    path: PathBuf,
    file: File,
    content: Content,
}

impl Gguf {
    pub fn open(path: &Path) -> ExResult<Self> {
        let mut file = File::open(path).map_err(|e| io_error(path, e))?;
        let content = Content::read(&mut file)
            .map_err(|e| err(kind::CORRUPT_GGUF, format!("cannot read GGUF file {}: {e}", path.display()), vec![path_detail(path)]))?;
        let len = file.metadata().map_err(|e| io_error(path, e))?.len();
        for (name, info) in &content.tensor_infos {
            let end = content.tensor_data_offset + info.offset + Self::byte_len(info.ggml_dtype, info.shape.elem_count()) as u64;
            if end > len {
                return Err(err(
                    kind::TRUNCATED_FILE,
                    format!("GGUF file {} is truncated: tensor `{name}` ends at byte {end}, the file has {len}", path.display()),
                    vec![path_detail(path), ("expected_bytes", Detail::Int(end as i128)), ("actual_bytes", Detail::Int(len as i128))],
                ));
            }
        }
        Ok(Gguf { path: path.to_path_buf(), file, content })
    }

    fn byte_len(t: GgmlDType, elems: usize) -> usize {
        elems / t.block_size() * t.type_size()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    fn missing(&self, key: &str) -> ExError {
        err(kind::CORRUPT_GGUF, format!("GGUF metadata `{key}` is missing from {}", self.path.display()), vec![path_detail(&self.path)])
    }

    fn wrong_type(&self, key: &str, want: &str) -> ExError {
        err(kind::CORRUPT_GGUF, format!("GGUF metadata `{key}` in {} is not {want}", self.path.display()), vec![path_detail(&self.path)])
    }

    pub fn string(&self, key: &str) -> ExResult<&str> {
        match self.content.metadata.get(key) {
            None => Err(self.missing(key)),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(self.wrong_type(key, "a string")),
        }
    }

    /// An unsigned integer of any GGUF integer width; `None` when absent.
    pub fn opt_usize(&self, key: &str) -> ExResult<Option<usize>> {
        let v = match self.content.metadata.get(key) {
            None => return Ok(None),
            Some(Value::U8(v)) => *v as i128,
            Some(Value::I8(v)) => *v as i128,
            Some(Value::U16(v)) => *v as i128,
            Some(Value::I16(v)) => *v as i128,
            Some(Value::U32(v)) => *v as i128,
            Some(Value::I32(v)) => *v as i128,
            Some(Value::U64(v)) => *v as i128,
            Some(Value::I64(v)) => *v as i128,
            Some(_) => return Err(self.wrong_type(key, "an integer")),
        };
        usize::try_from(v).map(Some).map_err(|_| self.wrong_type(key, "a non-negative integer"))
    }

    pub fn usize(&self, key: &str) -> ExResult<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn opt_f64(&self, key: &str) -> ExResult<Option<f64>> {
        match self.content.metadata.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v as f64)),
            Some(Value::F64(v)) => Ok(Some(*v)),
            Some(_) => Err(self.wrong_type(key, "a float")),
        }
    }

    pub fn f64(&self, key: &str) -> ExResult<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The tensor's shape, outermost first (GGUF stores dimensions innermost first; candle
    /// reverses them, so `[rows, cols]` here is PyTorch's `[out_features, in_features]`).
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.content.tensor_infos.get(name).map(|i| i.shape.dims().to_vec())
    }

    pub fn ggml_dtype(&self, name: &str) -> Option<GgmlDType> {
        self.content.tensor_infos.get(name).map(|i| i.ggml_dtype)
    }

    /// The tensor `name` dequantised to f32 host values, checked against `shape`. Dequantises a
    /// chunk of rows at a time into the output buffer, so the transient memory is one chunk.
    pub fn values(&mut self, name: &str, shape: &[usize]) -> ExResult<Vec<f32>> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| missing_tensor(&self.path, name))?;
        check_shape(&self.path, name, info.shape.dims(), shape)?;
        let dtype = info.ggml_dtype;
        if !dequantisable(dtype) {
            return Err(err(
                kind::UNSUPPORTED_QUANTIZATION,
                format!("tensor `{name}` in {} uses quantisation {dtype:?}, which cannot be dequantised", self.path.display()),
                vec![path_detail(&self.path), ("quantization", Detail::Text(format!("{dtype:?}")))],
            ));
        }
        let elems: usize = shape.iter().product();
        let cols = *shape.last().unwrap_or(&1);
        let block = dtype.block_size();
        if cols == 0 || elems == 0 {
            return Ok(Vec::new());
        }
        if !cols.is_multiple_of(block) {
            return Err(err(
                kind::CORRUPT_GGUF,
                format!("tensor `{name}` in {}: rows of {cols} values do not split into {dtype:?} blocks of {block}", self.path.display()),
                vec![path_detail(&self.path)],
            ));
        }
        let rows = elems / cols;
        let row_bytes = cols / block * dtype.type_size();
        // About 4 MiB of f32 output per chunk.
        let chunk_rows = ((1 << 20) / cols).clamp(1, rows);
        let start = self.content.tensor_data_offset + info.offset;
        let mut out = Vec::with_capacity(elems);
        let mut raw = vec![0u8; chunk_rows * row_bytes];
        let read_err = |e: std::io::Error| errors::io(&self.path, e);
        self.file.seek(SeekFrom::Start(start)).map_err(read_err)?;
        let mut row = 0;
        while row < rows {
            let n = chunk_rows.min(rows - row);
            let raw = &mut raw[..n * row_bytes];
            self.file.read_exact(raw).map_err(read_err)?;
            let candle_err = |e: candle_core::Error| {
                errors::engine("burn", format!("cannot dequantise tensor `{name}` ({dtype:?}) from {}: {e}", self.path.display()))
            };
            let q = ggml_file::qtensor_from_ggml(dtype, raw, vec![n, cols], &candle_core::Device::Cpu).map_err(candle_err)?;
            let t = q.dequantize(&candle_core::Device::Cpu).map_err(candle_err)?;
            let t = t.flatten_all().map_err(candle_err)?;
            out.extend(t.to_vec1::<f32>().map_err(candle_err)?);
            row += n;
        }
        Ok(out)
    }

    /// The tensor `name` as an f32 Burn tensor on `device`, checked against `shape`.
    pub fn tensor<const D: usize>(&mut self, name: &str, shape: [usize; D], device: &Device) -> ExResult<Tensor<D>> {
        Ok(f32_tensor(self.values(name, &shape)?, shape, device))
    }

    /// The tensor `name` as the file stores it, for the Candle engine.
    pub fn qtensor(&mut self, name: &str) -> ExResult<candle_core::quantized::QTensor> {
        self.content
            .tensor(&mut self.file, name, &candle_core::Device::Cpu)
            .map_err(|e| errors::engine("candle", format!("cannot read tensor `{name}` from {}: {e}", self.path.display())))
    }

    /// The `[rows, cols]` matrix `name` as GGML stores it, whole rows of blocks, when the block
    /// kernels decode its format (Q3_K rewritten as Q6_K, `widen`); `None` otherwise.
    pub fn blocks(&mut self, name: &str, rows: usize, cols: usize) -> ExResult<Option<(QFormat, Vec<u8>)>> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| missing_tensor(&self.path, name))?;
        check_shape(&self.path, name, info.shape.dims(), &[rows, cols])?;
        let dtype = info.ggml_dtype;
        let format = match dtype {
            GgmlDType::Q3K => QFormat::Q6_K,
            _ => match QFormat::from_ggml(dtype) {
                Some(f) => f,
                None => return Ok(None),
            },
        };
        if !cols.is_multiple_of(dtype.block_size()) {
            return Ok(None);
        }
        let start = self.content.tensor_data_offset + info.offset;
        let mut raw = vec![0u8; rows * cols / dtype.block_size() * dtype.type_size()];
        let read_err = |e: std::io::Error| errors::io(&self.path, e);
        self.file.seek(SeekFrom::Start(start)).map_err(read_err)?;
        self.file.read_exact(&mut raw).map_err(read_err)?;
        Ok(Some(if dtype == GgmlDType::Q3K { widen::q3_k_rows(&raw) } else { (format, raw) }))
    }

    /// The `[rows, cols]` matrix `name` in its GGML blocks, when `qmatmul` decodes its format
    /// (`None` otherwise: the caller dequantises). Q3_K blocks become the Q6_K blocks of the
    /// same values (`widen`); Q2_K's values, which no kernel format holds exactly, f16 rows
    /// (each weight rounded to f16, 2⁻¹¹ of its size at most).
    pub fn quantised(&mut self, name: &str, rows: usize, cols: usize) -> ExResult<Option<QMatrix>> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| missing_tensor(&self.path, name))?;
        check_shape(&self.path, name, info.shape.dims(), &[rows, cols])?;
        match info.ggml_dtype {
            GgmlDType::Q3K => return Ok(self.blocks(name, rows, cols)?.and_then(|(format, data)| QMatrix::new(format, rows, cols, data))),
            GgmlDType::Q2K => {
                let data = self.values(name, &[rows, cols])?.into_iter().flat_map(|v| f16::from_f32(v).to_bits().to_le_bytes()).collect();
                return Ok(QMatrix::new(QFormat::F16, rows, cols, data));
            }
            _ => {}
        }
        let info = &self.content.tensor_infos[name];
        let Some(format) = QFormat::from_ggml(info.ggml_dtype) else { return Ok(None) };
        if !cols.is_multiple_of(info.ggml_dtype.block_size()) {
            return Ok(None);
        }
        let start = self.content.tensor_data_offset + info.offset;
        let read_err = |e: std::io::Error| errors::io(&self.path, e);
        self.file.seek(SeekFrom::Start(start)).map_err(read_err)?;
        let file = &mut self.file;
        match QMatrix::read(format, rows, cols, |buf| file.read_exact(buf)) {
            Ok(m) => Ok(Some(m)),
            Err(Some(e)) => Err(read_err(e)),
            Err(None) => Ok(None),
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Temporary files for the readers' and models' tests.
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The message of an expected error.
    pub fn err_text<T>(r: crate::error::ExResult<T>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    /// The installed all-MiniLM-L6-v2 directory (`mix ex_burn.models.fetch`), or None (the
    /// calling test then skips, saying so).
    pub fn minilm_dir() -> Option<PathBuf> {
        installed(models_dir().join("embeddings/all-minilm-l6-v2"), "model.safetensors")
    }

    /// The installed SmolLM2-135M-Instruct GGUF file, or None.
    pub fn smollm_path() -> Option<PathBuf> {
        let dir = models_dir().join("llm/smollm2-135m-instruct");
        installed(dir.clone(), "SmolLM2-135M-Instruct.Q4_1.gguf").map(|d| d.join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    }

    fn installed(dir: PathBuf, file: &str) -> Option<PathBuf> {
        if dir.join(file).is_file() {
            Some(dir)
        } else {
            println!("SKIPPED: {} not found (mix ex_burn.models.fetch installs it)", dir.join(file).display());
            None
        }
    }

    /// A fresh directory under the system temp dir, removed on drop.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!("ex_burn_{tag}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl std::ops::Deref for TempDir {
        type Target = Path;

        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The models directory: `EXBURN_MODELS_DIR`, else `~/models`.
    pub fn models_dir() -> PathBuf {
        crate::process::env::models_dir()
    }

    /// Peak resident set size of this process so far, in MiB (`VmHWM`).
    pub fn peak_rss_mib() -> f64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(f64::NAN)
    }

    /// The reference data another agent generates with sentence-transformers / transformers.
    /// `EXBURN_REFERENCE_DIR` overrides the directory (default `test/data/pretrained`).
    pub fn reference(name: &str) -> serde_json::Value {
        // The references are committed data, so a missing one is a failure, never a skip.
        let path = crate::process::env::reference_dir().join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reference {}: {e}", path.display()));
        serde_json::from_str(&text).expect("reference JSON")
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{err_text, TempDir};
    use super::*;
    use candle_core::quantized::{gguf_file, QTensor};

    fn write_safetensors(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, safetensors::tensor::TensorView)> =
            tensors.iter().map(|(n, d, s, b)| (n.to_string(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }


    #[test]
    fn pretrained_safetensors_reads_f32_f16_bf16() {
        let dir = TempDir::new("st");
        let path = dir.path().join("w.safetensors");
        let vals = [1.5f32, -2.0, 0.25, 3.0, 4.0, -0.5];
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16b: Vec<u8> = vals.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let bf16b: Vec<u8> = vals.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
        write_safetensors(
            &path,
            &[("a", Dtype::F32, vec![2, 3], f32b), ("b", Dtype::F16, vec![2, 3], f16b), ("c", Dtype::BF16, vec![6], bf16b)],
        );
        let st = Safetensors::open(&path).unwrap();
        let dev = crate::testing::device().burn().unwrap();
        for (name, shape) in [("a", vec![2, 3]), ("b", vec![2, 3]), ("c", vec![6])] {
            assert_eq!(st.values(name, &shape).unwrap(), vals, "{name}");
        }
        let t = st.tensor("a", [2, 3], &dev).unwrap();
        assert_eq!(t.into_data().try_into_vec::<f32>().unwrap(), vals);
        assert!(err_text(st.values("a", &[3, 2])).contains("has shape [2, 3], expected [3, 2]"));
        assert!(err_text(st.values("zzz", &[1])).contains("tensor `zzz` is missing"));
    }

    #[test]
    fn pretrained_safetensors_bad_files() {
        let dir = TempDir::new("stbad");
        let missing = dir.path().join("nope.safetensors");
        assert!(err_text(Safetensors::open(&missing)).contains("file not found"));

        let path = dir.path().join("w.safetensors");
        let bytes: Vec<u8> = (0..64).flat_map(|v| (v as f32).to_le_bytes()).collect();
        write_safetensors(&path, &[("a", Dtype::F32, vec![64], bytes)]);
        let full = std::fs::read(&path).unwrap();

        let truncated = dir.path().join("trunc.safetensors");
        std::fs::write(&truncated, &full[..full.len() - 10]).unwrap();
        let e = err_text(Safetensors::open(&truncated));
        assert!(e.contains("truncated"), "{e}");

        let tiny = dir.path().join("tiny.safetensors");
        std::fs::write(&tiny, [1u8, 2, 3]).unwrap();
        assert!(err_text(Safetensors::open(&tiny)).contains("too small"));

        let corrupt = dir.path().join("corrupt.safetensors");
        let mut c = full.clone();
        c[8] = b'!'; // the JSON header's opening brace
        std::fs::write(&corrupt, &c).unwrap();
        let e = err_text(Safetensors::open(&corrupt));
        assert!(e.contains("header is corrupt"), "{e}");

        let huge = dir.path().join("huge.safetensors");
        let mut h = full.clone();
        h[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        std::fs::write(&huge, &h).unwrap();
        assert!(err_text(Safetensors::open(&huge)).contains("cannot read safetensors file"));
    }

    fn write_gguf(path: &Path, arch: &str, tensors: &[(&str, QTensor)]) {
        let mut f = File::create(path).unwrap();
        let arch = Value::String(arch.to_string());
        let count = Value::U32(7);
        let eps = Value::F32(1e-5);
        let md: Vec<(&str, &Value)> = vec![("general.architecture", &arch), ("x.count", &count), ("x.eps", &eps)];
        let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
        gguf_file::write(&mut f, &md, &ts).unwrap();
    }

    #[test]
    fn pretrained_gguf_reads_and_dequantises() {
        let dir = TempDir::new("gguf");
        let path = dir.path().join("m.gguf");
        let cpu = candle_core::Device::Cpu;
        let vals: Vec<f32> = (0..4 * 64).map(|i| ((i as f32) * 0.37).sin()).collect();
        let src = candle_core::Tensor::from_vec(vals.clone(), (4, 64), &cpu).unwrap();
        let f32t = QTensor::quantize(&src, GgmlDType::F32).unwrap();
        let q8 = QTensor::quantize(&src, GgmlDType::Q8_0).unwrap();
        let q41 = QTensor::quantize(&src, GgmlDType::Q4_1).unwrap();
        let q41_ref = q41.dequantize(&cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        write_gguf(&path, "llama", &[("a", f32t), ("b", q8), ("c", q41)]);

        let mut g = Gguf::open(&path).unwrap();
        assert_eq!(g.string("general.architecture").unwrap(), "llama");
        assert_eq!(g.usize("x.count").unwrap(), 7);
        assert!((g.f64("x.eps").unwrap() - 1e-5).abs() < 1e-9);
        assert_eq!(g.opt_usize("x.absent").unwrap(), None);
        assert!(err_text(g.usize("x.absent")).contains("`x.absent` is missing"));
        assert!(err_text(g.usize("x.eps")).contains("is not an integer"));
        assert_eq!(g.shape("a"), Some(vec![4, 64]));
        assert_eq!(g.values("a", &[4, 64]).unwrap(), vals);
        let b = g.values("b", &[4, 64]).unwrap();
        assert!(b.iter().zip(&vals).all(|(x, y)| (x - y).abs() < 0.02));
        assert_eq!(g.values("c", &[4, 64]).unwrap(), q41_ref);
        assert!(err_text(g.values("a", &[64, 4])).contains("expected [64, 4]"));
        assert!(err_text(g.values("zz", &[1])).contains("tensor `zz` is missing"));

        let full = std::fs::read(&path).unwrap();
        let truncated = dir.path().join("t.gguf");
        std::fs::write(&truncated, &full[..full.len() - 100]).unwrap();
        assert!(err_text(Gguf::open(&truncated)).contains("truncated"));
        let header_cut = dir.path().join("h.gguf");
        std::fs::write(&header_cut, &full[..40]).unwrap();
        assert!(err_text(Gguf::open(&header_cut)).contains("cannot read GGUF file"));
        let not_gguf = dir.path().join("n.gguf");
        std::fs::write(&not_gguf, b"this is not a gguf file at all").unwrap();
        assert!(err_text(Gguf::open(&not_gguf)).contains("cannot read GGUF file"));
        assert!(err_text(Gguf::open(&dir.path().join("absent.gguf"))).contains("file not found"));

        // Q8_1 has no dequantiser; an unknown type id fails when the header is read.
        let q81 = dir.path().join("q81.gguf");
        write_gguf(&q81, "llama", &[("a", QTensor::quantize(&src, GgmlDType::Q8_1).unwrap())]);
        let e = err_text(Gguf::open(&q81).unwrap().values("a", &[4, 64]));
        assert!(e.contains("uses quantisation Q8_1, which cannot be dequantised"), "{e}");
        let single = dir.path().join("one.gguf");
        let one = candle_core::Tensor::from_vec(vec![0f32; 64], 64, &cpu).unwrap();
        write_gguf(&single, "llama", &[("a", QTensor::quantize(&one, GgmlDType::F32).unwrap())]);
        let mut bytes = std::fs::read(&single).unwrap();
        // Tensor info: name (u64 length 1, "a"), rank 1, dim 64, then the u32 type id.
        let info: Vec<u8> = [&1u64.to_le_bytes()[..], b"a", &1u32.to_le_bytes(), &64u64.to_le_bytes(), &0u32.to_le_bytes()].concat();
        let at = bytes.windows(info.len()).position(|w| w == info.as_slice()).unwrap() + info.len() - 4;
        bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        std::fs::write(&single, &bytes).unwrap();
        let e = err_text(Gguf::open(&single));
        assert!(e.contains("cannot read GGUF file") && e.contains("99"), "{e}");
    }
}
