//! The papers' qualitative claims as checkable statements, and the run's assertions.
//!
//! A [`Finding`] is a claim from `papers/swan.txt` or `papers/wnw.txt` evaluated on this
//! run's numbers: it *holds* or *does not hold*, with the evidence; findings are reported,
//! not enforced (several are not expected to survive the move from 3–8B models to a 135M
//! one). A [`Check`] is what `kvtide reproduce` enforces in every run, `--quick` included:
//! lossless settings are lossless, the Rust measurements agree with the transformers
//! fixtures, and every reported table and figure is present — the command exits non-zero
//! when one fails.

use serde::Serialize;

use super::report::Table;

/// A paper claim evaluated on this run.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// Stable identifier.
    pub id: String,
    /// The claim.
    pub claim: String,
    /// Whether it holds here.
    pub holds: bool,
    /// The numbers behind the verdict.
    pub evidence: String,
}

impl Finding {
    /// A finding.
    pub fn new(id: &str, claim: &str, holds: bool, evidence: String) -> Self {
        Self { id: id.to_owned(), claim: claim.to_owned(), holds, evidence }
    }
}

/// An enforced assertion.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What is asserted.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// Measured values and the tolerance.
    pub detail: String,
}

impl Check {
    /// A check.
    pub fn new(name: &str, passed: bool, detail: String) -> Self {
        Self { name: name.to_owned(), passed, detail }
    }
}

/// Tolerances of the lossless checks: largest per-position |ΔNLL| (nats), smallest share of
/// positions with the same arg-max correctness, largest relative perplexity difference.
pub const LOSSLESS_TOLERANCE: (f64, f64, f64) = (5e-3, 0.99, 1e-3);

/// Whether an agreement is within [`LOSSLESS_TOLERANCE`].
pub fn lossless_ok(a: &super::decode::Agreement) -> bool {
    let (nll, hits, ppl) = LOSSLESS_TOLERANCE;
    a.max_abs_nll_diff <= nll && a.same_hit_rate >= hits && a.ppl_rel_diff <= ppl
}

/// A lossless check from an agreement.
pub fn lossless_check(name: &str, a: &super::decode::Agreement) -> Check {
    let (nll, hits, ppl) = LOSSLESS_TOLERANCE;
    Check::new(
        name,
        lossless_ok(a),
        format!(
            "max |ΔNLL| {:.2e} (≤ {nll:.0e}), same arg-max correctness {:.4} (≥ {hits}), relative Δppl {:.2e} (≤ {ppl:.0e})",
            a.max_abs_nll_diff, a.same_hit_rate, a.ppl_rel_diff
        ),
    )
}

/// Findings as a table.
pub fn findings_table(findings: &[Finding]) -> Table {
    let mut t = Table::new(
        "findings",
        "The papers' findings at this scale",
        &["finding", "holds here?", "evidence"],
    );
    for f in findings {
        t.row(vec![
            f.claim.clone(),
            if f.holds { "yes".into() } else { "**no**".into() },
            f.evidence.clone(),
        ]);
    }
    t
}

/// Checks as a table.
pub fn checks_table(checks: &[Check]) -> Table {
    let mut t = Table::new(
        "checks",
        "Enforced checks (the command fails if one fails)",
        &["check", "result", "detail"],
    );
    for c in checks {
        t.row(vec![
            c.name.clone(),
            if c.passed { "pass".into() } else { "**FAIL**".into() },
            c.detail.clone(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reproduce::decode::Agreement;

    #[test]
    fn tolerance_edges() {
        let ok = Agreement { max_abs_nll_diff: 1e-4, same_hit_rate: 1.0, ppl_rel_diff: 1e-6 };
        assert!(lossless_check("x", &ok).passed);
        for bad in [
            Agreement { max_abs_nll_diff: 0.1, ..ok },
            Agreement { same_hit_rate: 0.9, ..ok },
            Agreement { ppl_rel_diff: 0.01, ..ok },
        ] {
            assert!(!lossless_check("x", &bad).passed);
        }
        let t = findings_table(&[Finding::new("a", "claim", false, "e".into())]);
        assert_eq!(t.rows[0][1], "**no**");
    }
}
