//! A kernel's [`Plan`] from its contract: each name of a size, stride, bound or limit resolved
//! to a parameter's index (a constant stands for its expression), once per kernel.

use super::memo::Memo;
use super::{Axis, Dim, ParamPlan, Plan, Resolved, TensorPlan, MAX_PARAMS};
use crate::contract::{Contract, Expr};

impl Plan {
    /// Resolve `contract`'s names; an error names what the manifest gets wrong.
    pub fn new(kernel: &str, contract: &Contract) -> Result<Plan, String> {
        let params = &contract.params;
        if params.len() > MAX_PARAMS {
            return Err(format!(
                "{kernel}: {} parameters, at most {MAX_PARAMS} are supported",
                params.len()
            ));
        }
        let index = |name: &str| params.iter().position(|p| p.name == name);
        // A name is a parameter or a constant; a constant stands for its expression.
        let resolve = |text: &str| -> Result<Resolved, String> {
            let e = Expr::parse(text).map_err(|e| format!("{kernel}: {e}"))?;
            let mut r = Resolved {
                text: text.to_string(),
                mul: e.mul,
                factors: Vec::new(),
                add: e.add,
            };
            for f in &e.factors {
                if let Some(i) = index(f) {
                    r.factors.push(i);
                    continue;
                }
                let c = contract
                    .constants
                    .get(f)
                    .ok_or_else(|| format!("{kernel}: `{text}` names `{f}`, which is neither a parameter nor a constant"))?;
                let c = Expr::parse(c).map_err(|e| format!("{kernel}: {e}"))?;
                if c.add != 0 {
                    return Err(format!(
                        "{kernel}: constant `{f}` = `{c:?}` cannot be a factor"
                    ));
                }
                r.mul = r.mul.checked_mul(c.mul).ok_or("constant overflows")?;
                for g in &c.factors {
                    r.factors.push(index(g).ok_or_else(|| {
                        format!("{kernel}: constant `{f}` names `{g}`, which is not a parameter")
                    })?);
                }
            }
            Ok(r)
        };
        let mut plans = Vec::with_capacity(params.len());
        for p in params {
            if p.tensor.as_ref().is_some_and(|t| t.dims.len() > 8) {
                return Err(format!("{kernel}: {} has more than 8 dimensions", p.name));
            }
            let tensor = match &p.tensor {
                Some(t) => Some(TensorPlan {
                    dims: t
                        .dims
                        .iter()
                        .map(|d| {
                            Ok(Dim {
                                label: d.label.clone(),
                                size: resolve(&d.size)?,
                                stride: resolve(&d.stride)?,
                            })
                        })
                        .collect::<Result<_, String>>()?,
                    align_bytes: u64::from(t.align_bytes.max(1)),
                    stride_multiple: u64::from(t.stride_multiple.max(1)),
                    distinct: t.distinct,
                }),
                None => None,
            };
            let bound = |e: Option<&String>| e.map(|t| resolve(t)).transpose();
            let b = p.bounds.as_ref();
            plans.push(ParamPlan {
                name: p.name.clone(),
                kind: p.kind,
                role: p.role,
                elem: p.elem.clone(),
                elem_bytes: u64::from(p.elem_bytes.max(1)),
                nullable: p.nullable,
                tensor,
                min: bound(b.map(|b| &b.min))?,
                max: bound(b.and_then(|b| b.max.as_ref()))?,
                default: bound(b.and_then(|b| b.default.as_ref()))?,
            });
        }
        let constants = contract
            .constants
            .iter()
            .map(|(name, text)| Ok((name.clone(), resolve(text)?)))
            .collect::<Result<_, String>>()?;
        let limits = contract
            .limits
            .iter()
            .map(|l| {
                Ok((
                    resolve(&l.expr)?,
                    i64::try_from(l.max).unwrap_or(i64::MAX),
                    l.why.clone(),
                ))
            })
            .collect::<Result<_, String>>()?;
        let axis = |a: &crate::contract::GridAxis, name| -> Result<Axis, String> {
            Ok(Axis {
                dim: index(&a.dim).ok_or_else(|| {
                    format!(
                        "{kernel}: the grid counts `{}`, which is not a parameter",
                        a.dim
                    )
                })?,
                per_block: u64::from(a.per_block.max(1)),
                limit: u64::from(a.limit),
                name,
            })
        };
        let mut overlap_pairs = Vec::new();
        for (i, a) in plans.iter().enumerate() {
            for (j, b) in plans.iter().enumerate().skip(i + 1) {
                let tensors = a.tensor.is_some() && b.tensor.is_some();
                if tensors && (a.role.writes() || b.role.writes()) {
                    overlap_pairs.push((i, j));
                }
            }
        }
        let constant_named_like_param = contract.constants.keys().any(|c| index(c).is_some());
        Ok(Plan {
            kernel: kernel.to_string(),
            params: plans,
            constant_named_like_param,
            overlap_pairs,
            constants,
            limits,
            axes: [
                axis(&contract.launch.grid_x, "x")?,
                axis(&contract.launch.grid_y, "y")?,
            ],
            block_threads: contract.launch.block_threads,
            shared_mem_bytes: contract.launch.shared_mem_bytes,
            memo: Memo::default(),
        })
    }
}
