//! The metadata columns a shard ingest makes of its samples' small
//! members (WebDataset) or features (TFRecord), typed from what they
//! hold, and the columns that name where each sample came from.
//!
//! A column's type is the narrowest every value fits: integers → Int64,
//! numbers → Float64, text → Utf8; a column whose values disagree (a
//! `cls` that is `3` in one sample and `cat` in another), and JSON, are
//! Utf8 text. A sample without the member is null there. Names are the
//! member's extension or the feature's name with every character other
//! than a letter, digit or `_` made `_` (`image/class/label` →
//! `image_class_label`); a name sluice reserves (`key`, `width`, …, and
//! the source columns) gets a `member_` prefix.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field};

use crate::metadata::{KEY, RESERVED};

/// The shard a sample came from (its path under the source).
pub const SOURCE_SHARD: &str = "source_shard";
/// The sample's position in its shard, from 0.
pub const SOURCE_INDEX: &str = "source_index";
/// Where the sample starts in its shard: its first member's header (tar)
/// or its record (TFRecord), in bytes; its row group (Parquet).
pub const SOURCE_OFFSET: &str = "source_offset";

/// One small value of a sample.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Int(i64),
    Float(f64),
    Text(String),
    /// Text that is JSON (kept as written).
    Json(String),
}

impl Value {
    /// A member's bytes as a value: an integer or a number if that is all
    /// they say, else text without the line ending a text file ends with
    /// (`echo cat > 1.cls` is the label `cat`; `None`: not UTF-8).
    pub(crate) fn parse(bytes: &[u8], json: bool) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        if json {
            return Some(Self::Json(text.to_owned()));
        }
        let t = text.trim();
        if let Ok(i) = t.parse::<i64>() {
            return Some(Self::Int(i));
        }
        if let Ok(f) = t.parse::<f64>()
            && !t.is_empty()
            && t.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c))
        {
            return Some(Self::Float(f));
        }
        let line = text.strip_suffix('\n').unwrap_or(text);
        Some(Self::Text(
            line.strip_suffix('\r').unwrap_or(line).to_owned(),
        ))
    }

    fn text(&self) -> String {
        match self {
            Self::Int(i) => i.to_string(),
            Self::Float(f) => f.to_string(),
            Self::Text(t) | Self::Json(t) => t.clone(),
        }
    }
}

/// The column name for a member extension or a feature name.
pub(crate) fn column_name(raw: &str) -> String {
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        name.push('_');
    }
    let taken = [KEY, SOURCE_SHARD, SOURCE_INDEX, SOURCE_OFFSET];
    if RESERVED.contains(&name.as_str()) || taken.contains(&name.as_str()) {
        name.insert_str(0, "member_");
    }
    name
}

/// Where a sample came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceOf {
    pub shard: String,
    pub index: u64,
    pub offset: u64,
}

/// The columns of an ingest's samples, a row per sample, in order.
#[derive(Debug, Default)]
pub(crate) struct Columns {
    order: Vec<String>,
    by_name: HashMap<String, Vec<Option<Value>>>,
    sources: Vec<SourceOf>,
}

impl Columns {
    /// Adds a sample's row: its values by column, and its source.
    pub(crate) fn push(&mut self, values: Vec<(String, Value)>, source: SourceOf) {
        let row = self.sources.len();
        for (name, value) in values {
            let column = self.by_name.entry(name.clone()).or_insert_with(|| {
                self.order.push(name);
                Vec::new()
            });
            column.resize(row, None);
            column.push(Some(value));
        }
        self.sources.push(source);
    }

    /// The columns' fields and arrays: the members' in the order first
    /// seen, then the source's.
    pub(crate) fn finish(mut self) -> (Vec<Field>, Vec<ArrayRef>) {
        let rows = self.sources.len();
        let mut fields = Vec::with_capacity(self.order.len() + 3);
        let mut arrays = Vec::with_capacity(self.order.len() + 3);
        for name in &self.order {
            let mut values = self.by_name.remove(name).unwrap_or_default();
            values.resize(rows, None);
            let (dt, array) = typed(&values);
            fields.push(Field::new(name, dt, true));
            arrays.push(array);
        }
        let shards: StringArray = self.sources.iter().map(|s| Some(s.shard.clone())).collect();
        let index: UInt64Array = self.sources.iter().map(|s| Some(s.index)).collect();
        let offset: UInt64Array = self.sources.iter().map(|s| Some(s.offset)).collect();
        fields.push(Field::new(SOURCE_SHARD, DataType::Utf8, false));
        fields.push(Field::new(SOURCE_INDEX, DataType::UInt64, false));
        fields.push(Field::new(SOURCE_OFFSET, DataType::UInt64, false));
        arrays.push(Arc::new(shards));
        arrays.push(Arc::new(index));
        arrays.push(Arc::new(offset));
        (fields, arrays)
    }
}

/// A column of `values` in the narrowest type they all fit.
fn typed(values: &[Option<Value>]) -> (DataType, ArrayRef) {
    let present = || values.iter().flatten();
    if present().all(|v| matches!(v, Value::Int(_))) {
        let a: Int64Array = values
            .iter()
            .map(|v| match v {
                Some(Value::Int(i)) => Some(*i),
                _ => None,
            })
            .collect();
        return (DataType::Int64, Arc::new(a));
    }
    if present().all(|v| matches!(v, Value::Int(_) | Value::Float(_))) {
        let a: Float64Array = values
            .iter()
            .map(|v| match v {
                Some(Value::Int(i)) => Some(*i as f64),
                Some(Value::Float(f)) => Some(*f),
                _ => None,
            })
            .collect();
        return (DataType::Float64, Arc::new(a));
    }
    let a: StringArray = values.iter().map(|v| v.as_ref().map(Value::text)).collect();
    (DataType::Utf8, Arc::new(a))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Float64Type, Int64Type};

    use super::*;

    fn source(index: u64) -> SourceOf {
        SourceOf {
            shard: "s-0.tar".into(),
            index,
            offset: index * 1024,
        }
    }

    #[test]
    fn each_column_takes_the_narrowest_type_its_values_fit() {
        let mut c = Columns::default();
        let row = |cls: &str, score: &str, caption: &str| {
            vec![
                (
                    "cls".to_string(),
                    Value::parse(cls.as_bytes(), false).unwrap(),
                ),
                (
                    "score".to_string(),
                    Value::parse(score.as_bytes(), false).unwrap(),
                ),
                (
                    "txt".to_string(),
                    Value::parse(caption.as_bytes(), false).unwrap(),
                ),
            ]
        };
        c.push(row("3", "0.5", "a cat"), source(0));
        c.push(row(" 7\n", "2", "12"), source(1));
        c.push(vec![], source(2));
        let (fields, arrays) = c.finish();
        let names: Vec<_> = fields.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "cls",
                "score",
                "txt",
                SOURCE_SHARD,
                SOURCE_INDEX,
                SOURCE_OFFSET
            ]
        );
        let cls = arrays[0].as_primitive::<Int64Type>();
        assert_eq!((cls.value(0), cls.value(1), cls.is_null(2)), (3, 7, true));
        let score = arrays[1].as_primitive::<Float64Type>();
        assert_eq!((score.value(0), score.value(1)), (0.5, 2.0));
        let txt = arrays[2].as_string::<i32>();
        assert_eq!((txt.value(0), txt.value(1)), ("a cat", "12"));
        assert_eq!(arrays[4].len(), 3);
    }

    #[test]
    fn values_that_disagree_are_text_and_json_is_kept_as_written() {
        let mut c = Columns::default();
        c.push(vec![("cls".into(), Value::Int(3))], source(0));
        c.push(vec![("cls".into(), Value::Text("cat".into()))], source(1));
        c.push(
            vec![("json".into(), Value::parse(b"{\"a\": 1}", true).unwrap())],
            source(2),
        );
        let (fields, arrays) = c.finish();
        assert_eq!(fields[0].data_type(), &DataType::Utf8);
        assert_eq!(arrays[0].as_string::<i32>().value(0), "3");
        assert_eq!(arrays[1].as_string::<i32>().value(2), "{\"a\": 1}");
    }

    #[test]
    fn names_are_sql_friendly_and_never_sluices_own() {
        assert_eq!(column_name("image/class/label"), "image_class_label");
        assert_eq!(column_name("seg.png"), "seg_png");
        assert_eq!(column_name("width"), "member_width");
        assert_eq!(column_name("key"), "member_key");
        assert_eq!(column_name("source_shard"), "member_source_shard");
    }

    #[test]
    fn a_text_value_loses_the_line_ending_its_file_ends_with() {
        let text = |b: &[u8]| match Value::parse(b, false) {
            Some(Value::Text(t)) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(text(b"cat\n"), "cat");
        assert_eq!(text(b"cat\r\n"), "cat");
        assert_eq!(text(b"two\nlines\n"), "two\nlines");
        assert!(matches!(Value::parse(b" 3\n", false), Some(Value::Int(3))));
    }
}
