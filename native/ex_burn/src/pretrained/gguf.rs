//! A GGUF header reader: metadata and tensor descriptions, never tensor data.
//!
//! Candle's reader rejects a tensor type it does not know while parsing, which loses the chance to
//! say which quantisation is unsupported, and it cannot tell a truncated file until it reads the
//! data. This one keeps raw type ids, checks the data section's size against the tensors, and
//! bounds every length by the file size so a corrupt header fails cleanly instead of allocating.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use super::errors::{self, kind};
use crate::error::{Detail, ExResult};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer (or bool) as i64.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64,
            Value::I8(v) => v as i64,
            Value::U16(v) => v as i64,
            Value::I16(v) => v as i64,
            Value::U32(v) => v as i64,
            Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            Value::Bool(b) => b as i64,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|i| i as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => self.as_i64().map(|i| i != 0),
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// A GGML tensor type: its GGUF id, name, and block layout (elements, bytes per block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    pub block: Option<(u64, u64)>,
}

const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    pub fn from_id(id: u32) -> GgmlType {
        match TYPES.iter().find(|t| t.0 == id) {
            Some(&(id, name, elems, bytes)) => GgmlType { id, name, block: Some((elems, bytes)) },
            None => GgmlType { id, name: "unknown", block: None },
        }
    }

    /// A readable name, with the id for types this table does not know.
    pub fn label(&self) -> String {
        if self.block.is_some() {
            self.name.to_string()
        } else {
            format!("type {}", self.id)
        }
    }
}

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: the fastest-varying dimension first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Size of the tensor's data, when its type's block layout is known.
    pub fn bytes(&self) -> Option<u64> {
        let (elems, bytes) = self.ty.block?;
        let n: u64 = self.dims.iter().try_fold(1u64, |a, d| a.checked_mul(*d))?;
        Some(n.div_ceil(elems).checked_mul(bytes)?)
    }
}

#[derive(Clone, Debug)]
pub struct Header {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    pub file_size: u64,
}

impl Header {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(Value::as_i64)
    }

    pub fn architecture(&self) -> Option<&str> {
        self.str("general.architecture")
    }

    /// An integer hyperparameter, keyed by the architecture as GGUF writes them
    /// (`llama.context_length`, `qwen2.context_length`).
    pub fn arch_int(&self, name: &str) -> Option<i64> {
        self.int(&format!("{}.{name}", self.architecture()?))
    }

    /// The bytes the data section must hold: the end of the furthest tensor. `None` when a tensor's
    /// type is unknown (its size cannot be computed).
    pub fn required_size(&self) -> Option<u64> {
        self.tensors.iter().try_fold(self.data_offset, |end, t| Some(end.max(self.data_offset + t.offset + t.bytes()?)))
    }

    /// Fails with `truncated_file` when the file is shorter than its tensors need.
    pub fn check_complete(&self) -> ExResult<()> {
        match self.required_size() {
            Some(need) if need > self.file_size => Err(errors::truncated(&self.path, need, self.file_size)),
            _ => Ok(()),
        }
    }

    /// The distinct tensor types of the file, by name, with their tensor counts.
    pub fn tensor_types(&self) -> Vec<(GgmlType, usize)> {
        let mut out: Vec<(GgmlType, usize)> = Vec::new();
        for t in &self.tensors {
            match out.iter_mut().find(|(ty, _)| *ty == t.ty) {
                Some((_, n)) => *n += 1,
                None => out.push((t.ty, 1)),
            }
        }
        out
    }
}

struct Reader<R> {
    inner: R,
    pos: u64,
    size: u64,
    path: PathBuf,
    version: u32,
}

impl<R: Read> Reader<R> {
    fn truncated(&self, need: u64) -> crate::error::ExError {
        errors::truncated(&self.path, self.pos.saturating_add(need), self.size)
    }

    fn bytes(&mut self, n: u64) -> ExResult<Vec<u8>> {
        if n > self.size.saturating_sub(self.pos) {
            return Err(self.truncated(n));
        }
        let mut buf = vec![0u8; n as usize];
        self.inner.read_exact(&mut buf).map_err(|e| errors::io(&self.path, e))?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self) -> ExResult<[u8; N]> {
        if self.pos + N as u64 > self.size {
            return Err(self.truncated(N as u64));
        }
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf).map_err(|e| errors::io(&self.path, e))?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u32(&mut self) -> ExResult<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> ExResult<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count or length: u32 in GGUF v1, u64 after.
    fn len(&mut self) -> ExResult<u64> {
        if self.version == 1 {
            self.u32().map(u64::from)
        } else {
            self.u64()
        }
    }

    fn corrupt(&self, why: impl Into<String>) -> crate::error::ExError {
        let why = why.into();
        errors::err(
            kind::CORRUPT_GGUF,
            format!("corrupt GGUF header in {}: {why}", self.path.display()),
            vec![errors::path_detail(&self.path), ("reason", Detail::Text(why)), ("offset", Detail::Int(self.pos as i128))],
        )
    }

    fn string(&mut self) -> ExResult<String> {
        let n = self.len()?;
        let bytes = self.bytes(n)?;
        String::from_utf8(bytes).map_err(|_| self.corrupt("a string is not valid UTF-8"))
    }

    fn value(&mut self, ty: u32, depth: usize) -> ExResult<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                if depth > 4 {
                    return Err(self.corrupt("arrays nested too deeply"));
                }
                let elem = self.u32()?;
                let n = self.len()?;
                // Every element takes at least one byte: a count beyond the file is corrupt.
                if n > self.size.saturating_sub(self.pos) {
                    return Err(self.truncated(n));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(self.corrupt(format!("unknown metadata value type {other}"))),
        })
    }
}

/// Reads the header of the GGUF file at `path`.
pub fn read_header(path: &Path) -> ExResult<Header> {
    let file = File::open(path).map_err(|e| errors::io(path, e))?;
    let size = file.metadata().map_err(|e| errors::io(path, e))?.len();
    let mut r = Reader { inner: BufReader::with_capacity(1 << 16, file), pos: 0, size, path: path.to_path_buf(), version: 3 };
    let magic = if size >= 4 { r.array::<4>()? } else { [0; 4] };
    if &magic != b"GGUF" {
        return Err(errors::err(
            kind::NOT_GGUF,
            format!("{} is not a GGUF file", path.display()),
            vec![errors::path_detail(path)],
        ));
    }
    let version = r.u32()?;
    if !(1..=3).contains(&version) {
        return Err(r.corrupt(format!("unsupported GGUF version {version}")));
    }
    r.version = version;
    let tensor_count = r.len()?;
    let kv_count = r.len()?;
    if tensor_count > size || kv_count > size {
        return Err(r.corrupt("tensor or metadata count exceeds the file size"));
    }
    let mut metadata = HashMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let ty = r.u32()?;
        let value = r.value(ty, 0)?;
        metadata.insert(key, value);
    }
    let mut tensors = Vec::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        let name = r.string()?;
        let n_dims = r.u32()?;
        if n_dims > 8 {
            return Err(r.corrupt(format!("tensor {name} has {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| r.len()).collect::<ExResult<Vec<u64>>>()?;
        let ty = GgmlType::from_id(r.u32()?);
        let offset = r.u64()?;
        tensors.push(TensorInfo { name, dims, ty, offset });
    }
    let alignment = metadata.get("general.alignment").and_then(Value::as_i64).unwrap_or(32).max(1) as u64;
    let data_offset = r.pos.div_ceil(alignment) * alignment;
    Ok(Header { path: path.to_path_buf(), version, metadata, tensors, data_offset, file_size: size })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a GGUF v3 file from metadata and tensors `(name, dims, type id, data bytes)`.
    pub fn write_gguf(path: &Path, metadata: &[(&str, Value)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) {
        fn s(out: &mut Vec<u8>, v: &str) {
            out.extend((v.len() as u64).to_le_bytes());
            out.extend(v.as_bytes());
        }
        fn ty(v: &Value) -> u32 {
            match v {
                Value::U8(_) => 0,
                Value::I8(_) => 1,
                Value::U16(_) => 2,
                Value::I16(_) => 3,
                Value::U32(_) => 4,
                Value::I32(_) => 5,
                Value::F32(_) => 6,
                Value::Bool(_) => 7,
                Value::Str(_) => 8,
                Value::Array(_) => 9,
                Value::U64(_) => 10,
                Value::I64(_) => 11,
                Value::F64(_) => 12,
            }
        }
        fn val(out: &mut Vec<u8>, v: &Value) {
            match v {
                Value::U8(x) => out.push(*x),
                Value::I8(x) => out.push(*x as u8),
                Value::U16(x) => out.extend(x.to_le_bytes()),
                Value::I16(x) => out.extend(x.to_le_bytes()),
                Value::U32(x) => out.extend(x.to_le_bytes()),
                Value::I32(x) => out.extend(x.to_le_bytes()),
                Value::F32(x) => out.extend(x.to_le_bytes()),
                Value::Bool(x) => out.push(*x as u8),
                Value::Str(x) => s(out, x),
                Value::Array(xs) => {
                    out.extend(xs.first().map(ty).unwrap_or(4).to_le_bytes());
                    out.extend((xs.len() as u64).to_le_bytes());
                    xs.iter().for_each(|x| val(out, x));
                }
                Value::U64(x) => out.extend(x.to_le_bytes()),
                Value::I64(x) => out.extend(x.to_le_bytes()),
                Value::F64(x) => out.extend(x.to_le_bytes()),
            }
        }
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((metadata.len() as u64).to_le_bytes());
        for (k, v) in metadata {
            s(&mut out, k);
            out.extend(ty(v).to_le_bytes());
            val(&mut out, v);
        }
        let mut offset = 0u64;
        for (name, dims, t, data) in tensors {
            s(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(t.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        for (_, _, _, data) in tensors {
            out.extend(data);
            while out.len() % 32 != 0 {
                out.push(0);
            }
        }
        std::fs::write(path, out).unwrap();
    }

    /// A directory of its own under the system's temporary directory, removed when dropped.
    pub fn temp_dir(tag: &str) -> crate::pretrained::weights::test_support::TempDir {
        crate::pretrained::weights::test_support::TempDir::new(tag)
    }

    #[test]
    fn reads_metadata_and_tensor_infos() {
        let dir = temp_dir("gguf-read");
        let p = dir.join("m.gguf");
        write_gguf(
            &p,
            &[
                ("general.architecture", Value::Str("llama".into())),
                ("llama.context_length", Value::U32(128)),
                ("tokenizer.ggml.tokens", Value::Array(vec![Value::Str("a".into()), Value::Str("b".into())])),
            ],
            &[("w", vec![4, 2], 0, vec![0u8; 32])],
        );
        let h = read_header(&p).unwrap();
        assert_eq!(h.architecture(), Some("llama"));
        assert_eq!(h.int("llama.context_length"), Some(128));
        assert_eq!(h.tensors.len(), 1);
        assert_eq!(h.tensors[0].bytes(), Some(32));
        h.check_complete().unwrap();
    }

    #[test]
    fn truncated_and_foreign_files_are_distinct_errors() {
        let dir = temp_dir("gguf-bad");
        let p = dir.join("m.gguf");
        write_gguf(&p, &[("general.architecture", Value::Str("llama".into()))], &[("w", vec![64, 2], 0, vec![0u8; 512])]);
        let full = std::fs::read(&p).unwrap();
        // Data section cut short: the header reads, the completeness check fails.
        std::fs::write(&p, &full[..full.len() - 100]).unwrap();
        let h = read_header(&p).unwrap();
        assert_eq!(errors::kind_of(&h.check_complete().unwrap_err()), Some(kind::TRUNCATED_FILE));
        // Header cut short.
        std::fs::write(&p, &full[..30]).unwrap();
        assert_eq!(errors::kind_of(&read_header(&p).unwrap_err()), Some(kind::TRUNCATED_FILE));
        // Not a GGUF file at all.
        std::fs::write(&p, b"{\"hello\": 1}").unwrap();
        assert_eq!(errors::kind_of(&read_header(&p).unwrap_err()), Some(kind::NOT_GGUF));
        // A huge string length is caught before any allocation.
        let mut bad = full[..24].to_vec();
        bad.extend(u64::MAX.to_le_bytes());
        std::fs::write(&p, bad).unwrap();
        assert_eq!(errors::kind_of(&read_header(&p).unwrap_err()), Some(kind::TRUNCATED_FILE));
        assert_eq!(errors::kind_of(&read_header(&dir.join("nope.gguf")).unwrap_err()), Some(kind::MISSING_FILE));
    }
}
