//! Head triage (WnW §2.2 "Three-Way Classification", ablation A3): rank all `L × H_kv`
//! KV-heads by a signal (VS×HS by default; VS only or HS only for A3), take the top
//! `n_voice` as voice heads, the top `n_anchor` of those as anchors and the rest of them as
//! tidal; every other head is fixed. Roles serialise to JSON so calibration runs once per model.
//!
//! Heads are indexed `layer · kv_heads + kv_head` everywhere in this crate. Ties in the ranking
//! go to the lower head index.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, check_len, check_scores, param};

/// Default number of anchor heads (§2.2).
pub const DEFAULT_N_ANCHOR: usize = 5;

/// The role of one KV-head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Keeps all audio KV on the device; its attention drives chunk selection.
    Anchor,
    /// Keeps a retained subset on the device and the complement on the host, recalled by chunk.
    Tidal,
    /// Keeps a retained subset on the device; the complement is dropped.
    Fixed,
}

/// Which per-head signal ranks heads (and feeds the retention schedule).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankingSignal {
    /// `VS × HS` (WnW).
    #[default]
    VsHs,
    /// Voice score only (ablation A3).
    VsOnly,
    /// Head sensitivity only (ablation A3).
    HsOnly,
}

impl RankingSignal {
    /// The importance of a head with voice score `vs` and sensitivity `hs` under this signal.
    pub fn importance(self, vs: f32, hs: f32) -> f32 {
        match self {
            Self::VsHs => vs * hs,
            Self::VsOnly => vs,
            Self::HsOnly => hs,
        }
    }
}

/// Triage hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriageConfig {
    /// Voice heads (anchors + tidal).
    pub n_voice: usize,
    /// Anchors among the voice heads.
    pub n_anchor: usize,
    /// Ranking signal.
    pub signal: RankingSignal,
}

impl Default for TriageConfig {
    /// Voxtral at r_GPU = 0.2: 90 voice heads, 5 anchors, VS×HS (§3.4).
    fn default() -> Self {
        Self { n_voice: 90, n_anchor: DEFAULT_N_ANCHOR, signal: RankingSignal::VsHs }
    }
}

/// Roles of every KV-head of a model, with the scores they came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadRoles {
    layers: usize,
    kv_heads: usize,
    config: TriageConfig,
    voice_score: Vec<f32>,
    head_sensitivity: Vec<f32>,
    roles: Vec<Role>,
}

impl HeadRoles {
    /// Triage from per-head voice scores and sensitivities (length `layers · kv_heads`, index
    /// `layer · kv_heads + kv_head`).
    ///
    /// # Errors
    /// [`Error::Shape`] for wrong lengths, [`Error::NonFinite`]/[`Error::Negative`] for bad
    /// scores, [`Error::Param`] if `n_anchor > n_voice`, `n_voice > layers · kv_heads` or the
    /// grid is empty.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::{HeadRoles, Role, TriageConfig, RankingSignal};
    /// let vs = [0.9, 0.1, 0.5, 0.4];
    /// let hs = [1.0, 1.0, 1.0, 2.0];
    /// let cfg = TriageConfig { n_voice: 2, n_anchor: 1, signal: RankingSignal::VsHs };
    /// let roles = HeadRoles::triage(2, 2, &vs, &hs, cfg)?;
    /// assert_eq!(roles.roles(), &[Role::Anchor, Role::Fixed, Role::Fixed, Role::Tidal]);
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn triage(
        layers: usize,
        kv_heads: usize,
        voice_score: &[f32],
        head_sensitivity: &[f32],
        config: TriageConfig,
    ) -> Result<Self> {
        const OP: &str = "HeadRoles::triage";
        let n = check_grid(OP, layers, kv_heads)?;
        check_len(OP, "voice_score", voice_score, n)?;
        check_len(OP, "head_sensitivity", head_sensitivity, n)?;
        check_scores(OP, "voice_score", voice_score)?;
        check_scores(OP, "head_sensitivity", head_sensitivity)?;
        check_counts(OP, config, n)?;
        let importance: Vec<f32> = voice_score
            .iter()
            .zip(head_sensitivity)
            .map(|(&v, &h)| config.signal.importance(v, h))
            .collect();
        let mut roles = vec![Role::Fixed; n];
        for (rank, &head) in ranking(&importance).iter().take(config.n_voice).enumerate() {
            roles[head] = if rank < config.n_anchor { Role::Anchor } else { Role::Tidal };
        }
        Ok(Self {
            layers,
            kv_heads,
            config,
            voice_score: voice_score.to_vec(),
            head_sensitivity: head_sensitivity.to_vec(),
            roles,
        })
    }

    /// Roles given explicitly (e.g. a hand-edited calibration, or a test). Scores default to 1.
    ///
    /// # Errors
    /// [`Error::Shape`] if `roles.len() != layers · kv_heads`, [`Error::Param`] for an empty grid.
    pub fn from_roles(layers: usize, kv_heads: usize, roles: &[Role]) -> Result<Self> {
        const OP: &str = "HeadRoles::from_roles";
        let n = check_grid(OP, layers, kv_heads)?;
        check_len(OP, "roles", roles, n)?;
        let n_anchor = roles.iter().filter(|&&r| r == Role::Anchor).count();
        let n_voice = n_anchor + roles.iter().filter(|&&r| r == Role::Tidal).count();
        Ok(Self {
            layers,
            kv_heads,
            config: TriageConfig { n_voice, n_anchor, signal: RankingSignal::VsHs },
            voice_score: vec![1.0; n],
            head_sensitivity: vec![1.0; n],
            roles: roles.to_vec(),
        })
    }

    /// Number of layers `L`.
    pub fn layers(&self) -> usize {
        self.layers
    }
    /// KV-heads per layer `H_kv`.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }
    /// Total heads `L · H_kv`.
    pub fn total_kv_heads(&self) -> usize {
        self.roles.len()
    }
    /// The triage configuration.
    pub fn config(&self) -> TriageConfig {
        self.config
    }
    /// Role of every head (index `layer · kv_heads + kv_head`).
    pub fn roles(&self) -> &[Role] {
        &self.roles
    }
    /// Role of one head.
    pub fn role(&self, layer: usize, kv_head: usize) -> Option<Role> {
        (layer < self.layers && kv_head < self.kv_heads)
            .then(|| self.roles[layer * self.kv_heads + kv_head])
    }
    /// Per-head voice scores.
    pub fn voice_score(&self) -> &[f32] {
        &self.voice_score
    }
    /// Per-head sensitivities.
    pub fn head_sensitivity(&self) -> &[f32] {
        &self.head_sensitivity
    }
    /// Per-head importance under the configured signal (the `s_i` of Eq. 1 before
    /// normalisation).
    pub fn importance(&self) -> Vec<f32> {
        self.voice_score
            .iter()
            .zip(&self.head_sensitivity)
            .map(|(&v, &h)| self.config.signal.importance(v, h))
            .collect()
    }
    /// Heads with `role`, ascending.
    pub fn heads_with(&self, role: Role) -> impl Iterator<Item = usize> + '_ {
        self.roles.iter().enumerate().filter(move |(_, r)| **r == role).map(|(i, _)| i)
    }

    /// JSON text of these roles.
    ///
    /// # Errors
    /// [`Error::Json`] if serialisation fails (it does not for finite scores).
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Parses and validates roles written by [`HeadRoles::to_json`].
    ///
    /// # Errors
    /// [`Error::Json`] for malformed JSON; [`Error::Roles`] if lengths, scores or role counts
    /// are inconsistent.
    ///
    /// # Examples
    /// ```
    /// use kv_tiered::{HeadRoles, TriageConfig};
    /// let r = HeadRoles::triage(1, 4, &[0.1, 0.2, 0.3, 0.4], &[1.0; 4],
    ///     TriageConfig { n_voice: 2, n_anchor: 1, ..Default::default() })?;
    /// assert_eq!(HeadRoles::from_json(&r.to_json()?)?, r);
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self> {
        let roles: Self = serde_json::from_str(text)?;
        roles.validate().map_err(|e| Error::Roles(e.to_string()))?;
        Ok(roles)
    }

    fn validate(&self) -> Result<()> {
        const OP: &str = "HeadRoles::from_json";
        let n = check_grid(OP, self.layers, self.kv_heads)?;
        check_len(OP, "roles", &self.roles, n)?;
        check_len(OP, "voice_score", &self.voice_score, n)?;
        check_len(OP, "head_sensitivity", &self.head_sensitivity, n)?;
        check_scores(OP, "voice_score", &self.voice_score)?;
        check_scores(OP, "head_sensitivity", &self.head_sensitivity)?;
        check_counts(OP, self.config, n)?;
        let anchors = self.heads_with(Role::Anchor).count();
        let voice = anchors + self.heads_with(Role::Tidal).count();
        if anchors != self.config.n_anchor || voice != self.config.n_voice {
            return Err(param(
                OP,
                "roles",
                format!("{anchors} anchors / {voice} voice"),
                "counts matching config",
            ));
        }
        Ok(())
    }
}

/// Head indices by descending importance (ties: lower index first). Inputs must be finite.
pub fn ranking(importance: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..importance.len()).collect();
    order.sort_by(|&a, &b| importance[b].total_cmp(&importance[a]).then(a.cmp(&b)));
    order
}

fn check_grid(op: &'static str, layers: usize, kv_heads: usize) -> Result<usize> {
    match layers.checked_mul(kv_heads) {
        Some(n) if n > 0 && n <= u32::MAX as usize => Ok(n),
        _ => {
            Err(param(op, "layers × kv_heads", format!("{layers} × {kv_heads}"), "non-empty grid"))
        }
    }
}

fn check_counts(op: &'static str, config: TriageConfig, n: usize) -> Result<()> {
    if config.n_voice > n {
        return Err(param(op, "n_voice", config.n_voice, "≤ layers × kv_heads"));
    }
    if config.n_anchor > config.n_voice {
        return Err(param(op, "n_anchor", config.n_anchor, "≤ n_voice"));
    }
    Ok(())
}
