//! The wire form of a storage fragment: datafusion-proto's physical plan
//! encoding, with [`SluiceCodec`] for sluice's own node.
//!
//! Standard nodes (projection, filter, repartition …) and built-in
//! functions are datafusion-proto's business. Sluice UDFs travel by name
//! with their (complete, literal) arguments and are resolved in the
//! receiving node's function registry, where they are bound to the job's
//! UDF options. [`DatasetScanExec`] and [`StorageFragmentExec`] are
//! encoded by `SluiceCodec`, each after a byte that says which.

use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Result, internal_err};
use datafusion::config::ConfigOptions;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_proto_converter, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
use datafusion_proto::logical_plan::from_proto::parse_exprs;
use datafusion_proto::logical_plan::to_proto::serialize_exprs;
use datafusion_proto::physical_plan::from_proto::parse_physical_expr_with_converter;
use datafusion_proto::physical_plan::to_proto::serialize_physical_expr_with_converter;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalPlanNodeExt,
    PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;

use super::leaf::{FragmentPlan, NodeReads, StorageFragmentExec};
use super::scan::{DatasetScanExec, Take};
use super::windows::{WindowsExec, decode_windows, encode_windows};

/// The codec of sluice's physical nodes.
#[derive(Debug, Default, Clone, Copy)]
pub struct SluiceCodec;

/// A [`DatasetScanExec`] on the wire.
#[derive(Clone, PartialEq, prost::Message)]
struct DatasetScanNode {
    #[prost(string, tag = "1")]
    dataset: String,
    #[prost(uint32, repeated, tag = "2")]
    projection: Vec<u32>,
    #[prost(bool, tag = "3")]
    projected: bool,
    #[prost(message, optional, tag = "4")]
    filters: Option<protobuf::LogicalExprList>,
    #[prost(uint64, optional, tag = "5")]
    limit: Option<u64>,
    #[prost(message, optional, tag = "6")]
    schema: Option<protobuf::Schema>,
    #[prost(message, optional, tag = "7")]
    take: Option<TakeNode>,
}

/// A [`StorageFragmentExec`] on the wire: its plan encoded with the
/// node's take applied (none: the node reads nothing).
#[derive(Clone, PartialEq, prost::Message)]
struct StorageFragmentNode {
    #[prost(string, tag = "1")]
    dataset: String,
    #[prost(string, tag = "2")]
    node: String,
    #[prost(bytes = "vec", optional, tag = "3")]
    plan: Option<Vec<u8>>,
    #[prost(string, tag = "4")]
    udf_options: String,
    #[prost(message, optional, tag = "5")]
    schema: Option<protobuf::Schema>,
}

const SCAN: u8 = 0;
const FRAGMENT: u8 = 1;
const WINDOWS: u8 = 2;

fn proto_err(e: impl std::fmt::Display) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::Internal(e.to_string())
}

fn decode_storage_fragment(buf: &[u8]) -> Result<Arc<dyn ExecutionPlan>> {
    let node = StorageFragmentNode::decode(buf).map_err(proto_err)?;
    let schema: Schema = match &node.schema {
        Some(s) => s.try_into()?,
        None => return internal_err!("the fragment over {} has no schema", node.dataset),
    };
    let options = serde_json::from_str(&node.udf_options).map_err(proto_err)?;
    let (reads, plan) = match node.plan {
        Some(p) => (NodeReads::Whole, FragmentPlan::Encoded(p.into())),
        None => (
            NodeReads::Nothing,
            FragmentPlan::Encoded(Default::default()),
        ),
    };
    Ok(Arc::new(StorageFragmentExec::new(
        node.dataset,
        node.node,
        reads,
        plan,
        options,
        Arc::new(schema),
    )))
}

fn encode_storage_fragment(f: &StorageFragmentExec, buf: &mut Vec<u8>) -> Result<()> {
    let msg = StorageFragmentNode {
        dataset: f.dataset.clone(),
        node: f.node.clone(),
        plan: f.encoded()?.map(|b| b.to_vec()),
        udf_options: serde_json::to_string(&f.options).map_err(proto_err)?,
        schema: Some(f.rows_schema.as_ref().try_into()?),
    };
    buf.push(FRAGMENT);
    msg.encode(buf).map_err(proto_err)
}

/// A [`Take`] on the wire: row ids and slots packed.
#[derive(Clone, PartialEq, prost::Message)]
struct TakeNode {
    #[prost(uint64, tag = "1")]
    version: u64,
    #[prost(bool, tag = "2")]
    all: bool,
    #[prost(uint32, repeated, tag = "3")]
    rows: Vec<u32>,
    #[prost(uint32, repeated, tag = "4")]
    slots: Vec<u32>,
}

impl PhysicalExtensionCodec for SluiceCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return internal_err!("sluice's leaves have no inputs, got {}", inputs.len());
        }
        let buf = match buf.split_first() {
            Some((&FRAGMENT, rest)) => return decode_storage_fragment(rest),
            Some((&WINDOWS, rest)) => return decode_windows(rest),
            Some((&SCAN, rest)) => rest,
            _ => return internal_err!("not a node of sluice's codec"),
        };
        let node = DatasetScanNode::decode(buf).map_err(proto_err)?;
        let schema: Schema = match &node.schema {
            Some(s) => s.try_into()?,
            None => return internal_err!("DatasetScanExec of {} has no schema", node.dataset),
        };
        let filters = match &node.filters {
            Some(list) => parse_exprs(&list.expr, ctx, &DefaultLogicalExtensionCodec {})?,
            None => vec![],
        };
        let take = match node.take {
            Some(t) if t.all => Some(Take::index(t.version)),
            Some(t) => Some(
                Take::listed(t.version, t.rows, t.slots)
                    .map_err(|e| proto_err(format!("a take of {e}")))?,
            ),
            None => None,
        };
        Ok(Arc::new(
            DatasetScanExec::new(
                node.dataset,
                node.projected
                    .then(|| node.projection.iter().map(|&i| i as usize).collect()),
                filters,
                node.limit.map(|l| l as usize),
                Arc::new(schema),
            )
            .with_take(take),
        ))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if let Some(f) = node.downcast_ref::<StorageFragmentExec>() {
            return encode_storage_fragment(f, buf);
        }
        if let Some(w) = node.downcast_ref::<WindowsExec>() {
            buf.push(WINDOWS);
            return encode_windows(w, buf);
        }
        let Some(scan) = node.downcast_ref::<DatasetScanExec>() else {
            return internal_err!(
                "{} cannot be sent to a storage node (only sluice's leaves can)",
                node.name()
            );
        };
        let msg = DatasetScanNode {
            dataset: scan.dataset.clone(),
            projection: scan
                .projection
                .iter()
                .flatten()
                .map(|&i| i as u32)
                .collect(),
            projected: scan.projection.is_some(),
            filters: Some(protobuf::LogicalExprList {
                expr: serialize_exprs(&scan.filters, &DefaultLogicalExtensionCodec {})?,
            }),
            limit: scan.limit.map(|l| l as u64),
            schema: Some(scan.schema().as_ref().try_into()?),
            take: scan.take.as_ref().map(|t| TakeNode {
                version: t.version,
                all: t.rows.is_none(),
                rows: t.rows.as_deref().map(<[u32]>::to_vec).unwrap_or_default(),
                slots: t.slots.to_vec(),
            }),
        };
        buf.push(SCAN);
        msg.encode(buf).map_err(proto_err)
    }
}

/// Encodes a storage fragment.
pub fn encode_fragment(plan: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
    Ok(physical_plan_to_bytes_with_extension_codec(plan, &SluiceCodec)?.to_vec())
}

/// Decodes a storage fragment, resolving functions in `ctx`'s registry;
/// every function call's result field is recomputed where it is decoded
/// ([`Retyping`]), whichever node holds it.
pub fn decode_fragment(bytes: &[u8], ctx: &TaskContext) -> Result<Arc<dyn ExecutionPlan>> {
    physical_plan_from_bytes_with_proto_converter(bytes, ctx, &SluiceCodec, &Retyping)
}

/// datafusion-proto's converter, but for the function calls it decodes:
/// each is rebuilt from its (already rebuilt) arguments and the input
/// schema, so its result field is the one the planner saw (see
/// [`retype`]). A projection, a filter, an aggregate's arguments, a sort
/// key or a join condition: every expression of the fragment passes here.
#[derive(Debug, Default, Clone, Copy)]
struct Retyping;

impl PhysicalProtoConverterExtension for Retyping {
    fn proto_to_execution_plan(
        &self,
        proto: &protobuf::PhysicalPlanNode,
        ctx: &PhysicalPlanDecodeContext<'_>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        proto.try_into_physical_plan_with_context(ctx, self)
    }

    fn execution_plan_to_proto(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        codec: &dyn PhysicalExtensionCodec,
    ) -> Result<protobuf::PhysicalPlanNode> {
        protobuf::PhysicalPlanNode::try_from_physical_plan_with_converter(
            Arc::clone(plan),
            codec,
            self,
        )
    }

    fn proto_to_physical_expr(
        &self,
        proto: &protobuf::PhysicalExprNode,
        input_schema: &Schema,
        ctx: &PhysicalPlanDecodeContext<'_>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let expr = parse_physical_expr_with_converter(proto, input_schema, ctx, self)?;
        let config = ctx.task_ctx().session_config().options();
        Ok(retype(expr, input_schema, config)?.data)
    }

    fn physical_expr_to_proto(
        &self,
        expr: &Arc<dyn PhysicalExpr>,
        codec: &dyn PhysicalExtensionCodec,
    ) -> Result<protobuf::PhysicalExprNode> {
        serialize_physical_expr_with_converter(expr, codec, self)
    }
}

/// datafusion-proto carries a function call's result type but not its
/// field metadata, where sluice UDFs keep sizes known at plan time
/// (`sluice.shape`) for the calls above them; recomputing the result
/// field from the (already retyped) arguments restores it.
fn retype(
    expr: Arc<dyn PhysicalExpr>,
    schema: &Schema,
    config: &Arc<ConfigOptions>,
) -> Result<Transformed<Arc<dyn PhysicalExpr>>> {
    let Some(f) = expr.downcast_ref::<ScalarFunctionExpr>() else {
        return Ok(Transformed::no(expr));
    };
    let call = ScalarFunctionExpr::try_new(
        Arc::new(f.fun().clone()),
        f.args().to_vec(),
        schema,
        Arc::clone(config),
    )?;
    Ok(Transformed::yes(Arc::new(call)))
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::logical_expr::{col, lit};
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::limit::GlobalLimitExec;
    use datafusion::physical_plan::{ExecutionPlan, displayable};

    use super::*;
    use crate::fragment::scan::{DatasetScanExec, Take};

    fn scan(take: Option<Take>) -> DatasetScanExec {
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("label", DataType::Int64, true),
            Field::new("data", DataType::Binary, true),
        ]));
        DatasetScanExec::new(
            "pets".into(),
            Some(vec![0, 1, 3]),
            vec![col("label").gt(lit(2i64))],
            Some(7),
            schema,
        )
        .with_take(take)
    }

    fn leaf(plan: &Arc<dyn ExecutionPlan>) -> &DatasetScanExec {
        let mut node = plan;
        while node.downcast_ref::<DatasetScanExec>().is_none() {
            node = node.children()[0];
        }
        node.downcast_ref().unwrap()
    }

    #[test]
    fn a_fragment_decodes_to_the_plan_that_was_encoded() {
        let take = Take {
            version: 4,
            rows: Some(Arc::from(vec![9u32, 2, 5])),
            slots: Arc::from(vec![0u32, 1, 2]),
        };
        let leaf_plan: Arc<dyn ExecutionPlan> = Arc::new(scan(Some(take.clone())));
        let predicate = datafusion::physical_expr::expressions::binary(
            datafusion::physical_expr::expressions::col("label", &leaf_plan.schema()).unwrap(),
            datafusion::logical_expr::Operator::Gt,
            datafusion::physical_expr::expressions::lit(1i64),
            &leaf_plan.schema(),
        )
        .unwrap();
        let filtered = Arc::new(FilterExec::try_new(predicate, leaf_plan).unwrap());
        let plan: Arc<dyn ExecutionPlan> = Arc::new(GlobalLimitExec::new(filtered, 0, Some(3)));

        let bytes = encode_fragment(Arc::clone(&plan)).unwrap();
        let back = decode_fragment(&bytes, &TaskContext::default()).unwrap();

        assert_eq!(
            displayable(back.as_ref()).indent(true).to_string(),
            displayable(plan.as_ref()).indent(true).to_string()
        );
        assert_eq!(back.schema(), plan.schema());
        let (got, want) = (leaf(&back), leaf(&plan));
        assert_eq!(got.dataset, "pets");
        assert_eq!(got.projection, want.projection);
        assert_eq!(got.limit, Some(7));
        assert_eq!(got.filters, want.filters);
        assert_eq!(got.take, Some(take));
    }

    #[test]
    fn a_querys_scan_decodes_without_a_take_and_bytes_that_are_no_fragment_are_an_error() {
        let plan: Arc<dyn ExecutionPlan> = Arc::new(scan(None));
        let back =
            decode_fragment(&encode_fragment(plan).unwrap(), &TaskContext::default()).unwrap();
        assert_eq!(leaf(&back).take, None);
        assert!(decode_fragment(b"not a plan", &TaskContext::default()).is_err());
    }
}
