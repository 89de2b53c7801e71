//! A batch encoded whole, and gathered rows, read back as the rows they
//! name: any slice of a batch, whole and split messages, values shared
//! rather than copied, a finished column computed as the body is written,
//! and rows outside the sources refused.

use super::*;
use crate::slices::tests::{batch, decode};

/// Sources cut from the test batch at odd places, and rows that visit
/// them in a scrambled order (runs of one and of several rows).
fn gathered() -> (Gathered, Vec<RecordBatch>) {
    let b = batch();
    let sources = vec![
        b.slice(0, 12),
        b.slice(12, 20),
        b.slice(5, 31),
        b.slice(32, 5),
    ];
    let mut rows = Vec::new();
    for i in 0..40usize {
        let s = (i * 7) % sources.len();
        let r = (i * 5 + i / 3) % sources[s].num_rows();
        rows.push((s, r));
        if i % 6 == 0 && r + 1 < sources[s].num_rows() {
            rows.push((s, r + 1));
        }
    }
    (
        Gathered::new(b.schema(), sources.clone(), rows).unwrap(),
        sources,
    )
}

#[test]
fn the_message_reads_back_as_the_interleaved_rows() {
    let (g, _) = gathered();
    let want = g.to_batch().unwrap();
    assert_eq!(decode(&g.encode().unwrap(), g.schema()), want);
    for (start, len) in [(0, 1), (3, 17), (g.num_rows() - 2, 2), (4, 0)] {
        let s = g.slice(start, len);
        assert_eq!(
            decode(&s.encode().unwrap(), g.schema()),
            want.slice(start, len),
            "slice {start}+{len}"
        );
    }
    let empty = Gathered::empty(g.schema().clone());
    assert_eq!(decode(&empty.encode().unwrap(), g.schema()).num_rows(), 0);
}

#[test]
fn split_messages_cover_the_rows_in_order() {
    let (g, _) = gathered();
    let want = g.to_batch().unwrap();
    let parts = g.encode_split(64).unwrap();
    assert!(parts.len() > 1);
    let got: Vec<RecordBatch> = parts.iter().map(|m| decode(m, g.schema())).collect();
    assert_eq!(
        arrow::compute::concat_batches(g.schema(), &got).unwrap(),
        want
    );
}

#[test]
fn large_values_are_shared_not_copied() {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("v", DataType::Float32, false),
    ]));
    let values = arrow::array::Float32Array::from_iter_values((0..8192).map(|i| i as f32));
    let source = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)]).unwrap();
    let buffer = source.column(0).to_data().buffers()[0].clone();
    // Rows 4096.. then 0..4096: two runs of 16 KiB, each a piece.
    let rows = (4096..8192).chain(0..4096).map(|r| (0, r)).collect();
    let g = Gathered::new(schema, vec![source], rows).unwrap();
    let m = g.encode().unwrap();
    let at = |off: usize| buffer.as_ptr() as usize + off;
    let shared = |want: usize| {
        m.body
            .iter()
            .filter_map(|p| p.as_bytes())
            .any(|p| p.as_ptr() as usize == want)
    };
    assert!(shared(at(4096 * 4)) && shared(at(0)));
    let got = decode(&m, g.schema());
    assert_eq!(got, g.to_batch().unwrap());
}

/// Finishes an Int32 column as `[v, -v]` float32 pairs.
#[derive(Debug)]
struct Pairs;

impl Finish for Pairs {
    fn row_bytes(&self) -> usize {
        8
    }

    fn write(&self, source: &ArrayRef, start: usize, len: usize, out: &mut [u8]) {
        let a = source
            .as_any()
            .downcast_ref::<arrow::array::Int32Array>()
            .unwrap();
        for (r, o) in (start..start + len).zip(out.chunks_exact_mut(8)) {
            let v = if a.is_null(r) { 0.0 } else { a.value(r) as f32 };
            let w = if a.is_null(r) { 0.0 } else { -v };
            o[..4].copy_from_slice(&v.to_ne_bytes());
            o[4..].copy_from_slice(&w.to_ne_bytes());
        }
    }

    fn describe(&self, input: &str) -> String {
        format!("pairs({input})")
    }
}

#[test]
fn a_finished_column_is_computed_where_the_body_is_written() {
    use arrow::array::{Float32Array, Int32Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    let source = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, true),
        Field::new("v", DataType::Int32, true),
    ]));
    let item = Arc::new(Field::new_list_field(DataType::Float32, false));
    let out = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, true),
        Field::new("v", DataType::FixedSizeList(Arc::clone(&item), 2), true),
    ]));
    let batch = |from: i32, n: i32| {
        let v: Int32Array = (from..from + n)
            .map(|i| (i % 5 != 0).then_some(i))
            .collect();
        let names: StringArray = (from..from + n).map(|i| Some(format!("s{i}"))).collect();
        RecordBatch::try_new(Arc::clone(&source), vec![Arc::new(names), Arc::new(v)]).unwrap()
    };
    let sources = vec![batch(0, 9), batch(100, 7)];
    let rows: Vec<(usize, usize)> = [
        (1, 3),
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (0, 5),
        (1, 6),
        (0, 8),
    ]
    .to_vec();
    let finishes: Finishes = Arc::from(vec![None, Some(Arc::new(Pairs) as Arc<dyn Finish>)]);
    let g = Gathered::finished(
        Arc::clone(&out),
        Some(finishes),
        sources.clone(),
        rows.clone(),
    )
    .unwrap();
    // What the finished column is: the rows' values and their negatives,
    // NULL (zeros underneath) where the source is.
    let mut values = Vec::new();
    let mut nulls = Vec::new();
    for &(s, r) in &rows {
        let a = sources[s]
            .column(1)
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap();
        let v = if a.is_null(r) { 0.0 } else { a.value(r) as f32 };
        values.extend([v, if a.is_null(r) { 0.0 } else { -v }]);
        nulls.push(a.is_valid(r));
    }
    let want = FixedSizeListArray::try_new(
        item,
        2,
        Arc::new(Float32Array::from(values)),
        Some(NullBuffer::from(nulls)),
    )
    .unwrap();
    let made = g.to_batch().unwrap();
    assert_eq!(made.column(1).as_ref(), &want as &dyn Array);
    let m = g.encode().unwrap();
    assert!(m.has_computed());
    assert_eq!(decode(&m, g.schema()), made);
    assert_eq!(decode(&m.clone().made(), g.schema()), made);
    assert!(!m.made().has_computed());
    for (start, len) in [(0, 1), (2, 5), (7, 1)] {
        let s = g.slice(start, len);
        assert_eq!(
            decode(&s.encode().unwrap(), g.schema()),
            made.slice(start, len)
        );
    }
    // A column of another size is refused.
    let wrong = Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, true),
        Field::new("v", DataType::Float64, true),
    ]));
    let finishes: Finishes = Arc::from(vec![None, Some(Arc::new(Pairs) as Arc<dyn Finish>)]);
    assert!(Gathered::finished(wrong, Some(finishes), sources, rows).is_err());
}

#[test]
fn rows_outside_the_sources_are_refused() {
    let (g, sources) = gathered();
    assert!(Gathered::new(g.schema().clone(), sources.clone(), vec![(9, 0)]).is_err());
    assert!(Gathered::new(g.schema().clone(), sources, vec![(0, 12)]).is_err());
}

#[test]
fn every_slice_of_a_batch_reads_back_as_itself() {
    let b = batch();
    for (start, len) in [(0, 37), (0, 10), (3, 11), (9, 20), (36, 1), (5, 0)] {
        let s = b.slice(start, len);
        let m = encode_batch(&s).unwrap();
        assert_eq!(decode(&m, b.schema_ref()), s, "slice {start}+{len}");
    }
}

#[test]
fn the_tensor_bytes_are_shared_not_copied() {
    let b = batch();
    let values = b.column(2).to_data().child_data()[0].buffers()[0].clone();
    let m = encode_batch(&b.slice(8, 16)).unwrap();
    let want = values.as_ptr() as usize + 8 * 6 * 4;
    assert!(
        m.body
            .iter()
            .filter_map(|p| p.as_bytes())
            .any(|p| p.as_ptr() as usize == want),
        "no body piece points into the tensor's buffer"
    );
}
