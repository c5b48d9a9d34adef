//! The registry: the folder of configuration parsed once into checked types. Unknown fields,
//! dangling references and duplicate names are errors naming the file, the path inside it and
//! what would be right. Nothing downstream re-checks a string.

use crate::handler::{Builtin, Handler};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use cedar_policy::EntityUid;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::canon::{canonical, sha256_tagged};
use crate::config::{
    GatewayFile, PrincipalConfig, PrincipalsFile, RoleConfig, ToolConfig, ToolsFile,
};
use crate::model::{PrincipalKind, Tier};
use crate::policy::{Policies, uid};
use crate::schema::{CedarType, InputSchema};

/// One problem with the registry, located precisely.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// File relative to the registry folder.
    pub file: String,
    /// Path inside the file (`tools[2].input_schema.properties.amount`).
    pub path: String,
    /// A stable rule id (`schema.unbounded-number`, `ref.dangling`…).
    pub rule: String,
    pub message: String,
    /// What would be right.
    pub fix: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: [{}] {}",
            self.file, self.path, self.rule, self.message
        )?;
        if !self.fix.is_empty() {
            write!(f, "\n    fix: {}", self.fix)?;
        }
        Ok(())
    }
}

/// Why a registry could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read or parsed at all (exit 2).
    #[error("{file}: {message}")]
    Unreadable { file: String, message: String },
    /// It parsed, but is inconsistent (exit 1).
    #[error("{} problem(s) in the registry:\n{}", .0.len(), .0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Finding>),
}

/// The registry's version: a content hash over everything that decides, plus a human label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RegistryVersion {
    pub hash: String,
    pub label: String,
}

impl fmt::Display for RegistryVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({})",
            self.label,
            &self.hash[..19.min(self.hash.len())]
        )
    }
}

/// A tool with its schema compiled and its Cedar identities made.
#[derive(Debug)]
pub struct Tool {
    pub config: ToolConfig,
    pub schema: InputSchema,
    /// The file that declares it (relative), for CODEOWNERS and messages.
    pub file: String,
    /// Position in its file's `tools` list.
    pub index: usize,
    pub(crate) resource: EntityUid,
    pub(crate) action: EntityUid,
    /// Its window budgets, checked (`window_budgets` in the file).
    pub windows: Vec<crate::budget::WindowBudget>,
    /// The built-in it is, read from `handler.builtin` (see [`Tool::handler`]).
    builtin: Option<Builtin>,
}

impl Tool {
    pub fn name(&self) -> &str {
        &self.config.name
    }
    /// Who does its work. A loaded registry has checked that the tool names exactly one
    /// upstream or one known built-in.
    pub fn handler(&self) -> Handler<'_> {
        let h = &self.config.handler;
        match self.builtin {
            Some(b) => Handler::Builtin(b),
            None => Handler::Upstream {
                server: h.upstream.as_deref().unwrap_or_default(),
                tool: h.tool.as_deref().unwrap_or(&self.config.name),
            },
        }
    }
    /// The built-in it is, if it is one.
    pub fn builtin(&self) -> Option<Builtin> {
        self.builtin
    }
    pub fn is_listed_for(&self, role: &str) -> bool {
        self.config.roles.iter().any(|r| r == role)
    }
}

/// A principal with its ancestors resolved.
#[derive(Debug)]
pub struct Principal {
    pub config: PrincipalConfig,
    /// Parent, grandparent… up to the root, whose budgets this principal also draws from.
    pub ancestors: Vec<String>,
    pub(crate) entity: EntityUid,
}

impl Principal {
    pub fn id(&self) -> &str {
        &self.config.id
    }
    pub fn role(&self) -> &str {
        &self.config.role
    }
    /// The daily budget of a tier, if one is set (read is never budgeted).
    pub fn budget(&self, tier: Tier) -> Option<u32> {
        match tier {
            Tier::Read => None,
            Tier::Act => self.config.budgets.act,
            Tier::Spend => self.config.budgets.spend,
        }
    }
}

/// The loaded, checked registry.
#[derive(Debug)]
pub struct Registry {
    pub dir: PathBuf,
    pub gateway: GatewayFile,
    pub roles: BTreeMap<String, RoleConfig>,
    tools: Vec<Tool>,
    tool_index: HashMap<String, usize>,
    principals: Vec<Principal>,
    principal_index: HashMap<String, usize>,
    credential_index: HashMap<String, usize>,
    pub policies: Policies,
    pub version: RegistryVersion,
}

/// Where the registry's reference page is: every key of every file, generated from these
/// types (`docs/registry.md` in the repository).
pub const REFERENCE: &str = "docs/registry.md (the registry reference)";

fn rel(dir: &Path, p: &Path) -> String {
    p.strip_prefix(dir).unwrap_or(p).display().to_string()
}

fn read_yaml<T: DeserializeOwned>(dir: &Path, path: &Path) -> Result<T, LoadError> {
    let file = rel(dir, path);
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::Unreadable {
        file: file.clone(),
        message: format!("cannot read: {e}"),
    })?;
    parse_yaml(&file, &text)
}

/// Parses YAML through `serde_json::Value`, so every error names its exact path.
pub fn parse_yaml<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, LoadError> {
    let value: Value = yaml_serde::from_str(text).map_err(|e| LoadError::Unreadable {
        file: file.to_string(),
        message: format!("not valid YAML: {e}"),
    })?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        LoadError::Invalid(vec![Finding {
            file: file.to_string(),
            path: if path == "." {
                "(top level)".into()
            } else {
                path
            },
            rule: "config.shape".into(),
            message: e.into_inner().to_string(),
            fix: format!(
                "see {REFERENCE} for the fields each file takes (`toolgate check --schema {}` \
                 prints the file's JSON Schema for an editor)",
                crate::reference::FileKind::of_file(file).map_or("toolgate", |k| k.name())
            ),
        }])
    })
}

fn sorted_files(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, LoadError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| LoadError::Unreadable {
            file: dir.display().to_string(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    Ok(out)
}

/// The contents of a registry folder, read but not yet checked. Kept separate from loading so
/// the lint and `registry diff` can work on the raw declarations.
#[derive(Debug, Clone)]
pub struct Sources {
    pub gateway: GatewayFile,
    /// (file, tool) in file order.
    pub tools: Vec<(String, usize, ToolConfig)>,
    pub principals: PrincipalsFile,
    /// (file, text)
    pub policies: Vec<(String, String)>,
}

impl Sources {
    pub fn read(dir: &Path) -> Result<Sources, LoadError> {
        let top = dir.join("toolgate.yaml");
        if !top.is_file() {
            return Err(LoadError::Unreadable {
                file: top.display().to_string(),
                message:
                    "no toolgate.yaml here; a registry folder holds toolgate.yaml, tools/*.yaml, \
                          principals.yaml and policies/*.cedar"
                        .into(),
            });
        }
        let gateway: GatewayFile = read_yaml(dir, &top)?;
        let mut tools = Vec::new();
        let mut findings = Vec::new();
        for path in sorted_files(&dir.join("tools"), "yaml")? {
            match read_yaml::<ToolsFile>(dir, &path) {
                Ok(f) => {
                    for (i, mut t) in f.tools.into_iter().enumerate() {
                        crate::schema::normalize_null_types(&mut t.input_schema);
                        if let Some(o) = &mut t.output_schema {
                            crate::schema::normalize_null_types(o);
                        }
                        tools.push((rel(dir, &path), i, t));
                    }
                }
                Err(LoadError::Invalid(mut f)) => findings.append(&mut f),
                Err(e) => return Err(e),
            }
        }
        let principals_path = dir.join("principals.yaml");
        let principals = match read_yaml::<PrincipalsFile>(dir, &principals_path) {
            Ok(p) => p,
            Err(LoadError::Invalid(mut f)) => {
                findings.append(&mut f);
                PrincipalsFile {
                    roles: BTreeMap::new(),
                    principals: vec![],
                }
            }
            Err(e) => return Err(e),
        };
        if !findings.is_empty() {
            return Err(LoadError::Invalid(findings));
        }
        let mut policies = Vec::new();
        for path in sorted_files(&dir.join("policies"), "cedar")? {
            let text = std::fs::read_to_string(&path).map_err(|e| LoadError::Unreadable {
                file: rel(dir, &path),
                message: e.to_string(),
            })?;
            policies.push((rel(dir, &path), text));
        }
        Ok(Sources {
            gateway,
            tools,
            principals,
            policies,
        })
    }

    /// The content hash of everything that decides a call.
    pub fn version(&self) -> RegistryVersion {
        let tools: Vec<&ToolConfig> = self.tools.iter().map(|(_, _, t)| t).collect();
        let mut doc = json!({
            "tools": tools,
            "principals": self.principals,
            "policies": self.policies,
            "approvals": self.gateway.approvals,
        });
        // Accepted findings decide nothing, but they are part of what was reviewed: a version
        // names them too (absent when there are none, so older versions keep their hashes).
        if !self.gateway.accept.is_empty() {
            doc["accept"] = json!(self.gateway.accept);
        }
        let hash = sha256_tagged(canonical(&doc).as_bytes());
        let label = self
            .gateway
            .label
            .clone()
            .unwrap_or_else(|| format!("registry-{}", &hash[7..15]));
        RegistryVersion { hash, label }
    }
}

impl Registry {
    /// Reads and checks a registry folder.
    pub fn load(dir: impl AsRef<Path>) -> Result<Registry, LoadError> {
        let dir = dir.as_ref();
        let sources = Sources::read(dir)?;
        Self::from_sources(dir, sources)
    }

    /// Checks `sources`, read from `dir`, into a registry, phase by phase; every problem any
    /// phase finds is reported together, each naming its file, path and fix.
    pub fn from_sources(dir: &Path, sources: Sources) -> Result<Registry, LoadError> {
        let version = sources.version();
        let Sources {
            gateway,
            tools: tool_decls,
            principals: pfile,
            policies: policy_files,
        } = sources;
        let mut findings = crate::bounds::check(&gateway, &tool_decls, &pfile);
        findings.extend(crate::keyconfig::check(&gateway));
        let mut finding = |file: &str, path: String, rule: &str, message: String, fix: String| {
            findings.push(Finding {
                file: file.to_string(),
                path,
                rule: rule.to_string(),
                message,
                fix,
            })
        };

        let (mut tools, tool_index) = compile_tools(tool_decls, &mut finding);
        let roles = pfile.roles.clone();
        let role_names = role_names(&pfile);
        for t in &tools {
            check_tool(t, &tool_index, &tools, &gateway, &role_names, &mut finding);
        }
        let principals = index_principals(&pfile, &roles, &mut finding);
        check_role_defaults(&roles, &pfile, &mut finding);
        check_acceptances(&gateway, &mut finding);
        check_runs(&gateway, &mut finding);
        compile_window_budgets(&mut tools, &pfile, &mut finding);
        let policies = load_policies(&policy_files, &tools, &pfile, &mut finding);
        check_approvals(&gateway, &tools, &pfile, policies.as_ref(), &mut finding);

        if !findings.is_empty() {
            return Err(LoadError::Invalid(findings));
        }
        Ok(Registry {
            dir: dir.to_path_buf(),
            gateway,
            roles,
            tools,
            tool_index,
            principals: principals.principals,
            principal_index: principals.by_id,
            credential_index: principals.by_key,
            policies: policies.expect("no findings means policies loaded"),
            version,
        })
    }

    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tool_index.get(name).map(|&i| &self.tools[i])
    }

    pub fn principals(&self) -> &[Principal] {
        &self.principals
    }

    pub fn principal(&self, id: &str) -> Option<&Principal> {
        self.principal_index.get(id).map(|&i| &self.principals[i])
    }

    /// The principal holding an API key, by the key's hash. Constant work per lookup.
    pub fn principal_by_key(&self, api_key: &str) -> Option<&Principal> {
        let hash = api_key_hash(api_key);
        self.credential_index
            .get(&hash)
            .map(|&i| &self.principals[i])
    }

    /// The id of the credential an API key is, within its principal.
    pub fn credential_id_of_key(&self, api_key: &str) -> Option<&str> {
        let hash = api_key_hash(api_key);
        let p = self
            .credential_index
            .get(&hash)
            .map(|&i| &self.principals[i])?;
        p.config
            .credentials
            .iter()
            .find(|c| c.sha256.eq_ignore_ascii_case(&hash))
            .map(|c| c.id.as_str())
    }

    /// The principal an OAuth subject maps to.
    pub fn principal_by_subject(&self, subject: &str) -> Option<&Principal> {
        self.principals.iter().find(|p| {
            p.config
                .credentials
                .iter()
                .any(|c| c.oauth_subject.as_deref() == Some(subject))
        })
    }

    /// Whether `role` reviews planned steps (it lists `step.approve` or `step.reject`): such a
    /// role works in other principals' plan runs.
    pub fn reviews_plans(&self, role: &str) -> bool {
        self.tools_for_role(role)
            .any(|t| t.builtin().is_some_and(Builtin::is_review))
    }

    /// Tools listed for a role, in declaration order: that role's whole world.
    pub fn tools_for_role<'a>(&'a self, role: &'a str) -> impl Iterator<Item = &'a Tool> + 'a {
        self.tools.iter().filter(move |t| t.is_listed_for(role))
    }

    pub fn role(&self, name: &str) -> Option<&RoleConfig> {
        self.roles.get(name)
    }

    /// Whether a `tools/call` of `tool` by `principal` may run only as one of the principal's
    /// planned steps: its role is plan-bound and lists the tool, which is not a built-in (a
    /// built-in is answered by toolgate itself). Such a call that matches no pending step of a
    /// submitted plan is refused with [`UNPLANNED`].
    pub fn is_plan_bound_call(&self, principal: &str, tool: &str) -> bool {
        let Some(p) = self.principal(principal) else {
            return false;
        };
        self.role(p.role()).is_some_and(|r| r.plan_bound)
            && self
                .tool(tool)
                .is_some_and(|t| t.is_listed_for(p.role()) && t.builtin().is_none())
    }
}

/// The rule that refuses a plan-bound principal's call that matches none of its planned steps.
pub const UNPLANNED: crate::rule::Rule = crate::rule::Rule::PLAN_UNPLANNED;

/// Why a plan-bound principal's call was refused with [`UNPLANNED`]; `in_run`: the call named
/// its run, and matched no step of that run.
pub fn unplanned_reason(principal: &str, tool: &str, in_run: bool) -> String {
    format!(
        "'{principal}' is plan-bound: it runs only the steps a submitted plan assigned to it, and \
         this '{tool}' call matches none of them (same tool and exactly the same inputs{})",
        if in_run { ", in this run" } else { "" }
    )
}

/// Where a finding goes: (file, path, rule, message, fix).
type Sink<'a> = dyn FnMut(&str, String, &str, String, String) + 'a;

/// Tools by name: their place in the registry's list.
type ToolIndex = HashMap<String, usize>;

/// The tools, each under a unique name with its input schema compiled; a duplicate or a tool
/// whose schema does not compile is left out.
fn compile_tools(
    decls: Vec<(String, usize, ToolConfig)>,
    finding: &mut Sink<'_>,
) -> (Vec<Tool>, ToolIndex) {
    let mut tools = Vec::new();
    let mut tool_index = HashMap::new();
    for (file, i, cfg) in decls {
        let path = format!("tools[{i}]");
        if let Some(&prev) = tool_index.get(&cfg.name) {
            let prev: &Tool = &tools[prev];
            finding(
                &file,
                format!("{path}.name"),
                "ref.duplicate",
                format!(
                    "tool '{}' is declared twice (also in {} tools[{}])",
                    cfg.name, prev.file, prev.index
                ),
                "give each tool one declaration and a unique name".into(),
            );
            continue;
        }
        if Builtin::from_name(&cfg.name).is_some() && cfg.handler.builtin.is_none() {
            finding(
                &file,
                format!("{path}.name"),
                "ref.builtin-name",
                format!("'{}' is the name of a built-in tool", cfg.name),
                "declare it with `handler: {builtin: <name>}` or choose another name".into(),
            );
        }
        let schema = match InputSchema::compile(&cfg.input_schema) {
            Ok(s) => s,
            Err(e) => {
                finding(
                    &file,
                    format!("{path}.input_schema"),
                    "schema.invalid",
                    format!("not a valid JSON Schema: {e}"),
                    "fix the schema so it compiles under draft 2020-12".into(),
                );
                continue;
            }
        };
        tool_index.insert(cfg.name.clone(), tools.len());
        tools.push(Tool {
            builtin: cfg.handler.builtin_kind(),
            resource: uid("Tool", &cfg.name),
            action: uid("Action", &cfg.name),
            config: cfg,
            schema,
            file,
            index: i,
            windows: Vec::new(),
        });
    }
    (tools, tool_index)
}

/// Every role a tool may name: those declared under `roles:` and those principals hold.
fn role_names(pfile: &PrincipalsFile) -> HashSet<&str> {
    pfile
        .roles
        .keys()
        .map(String::as_str)
        .chain(pfile.principals.iter().map(|p| p.role.as_str()))
        .collect()
}

/// Every check of one tool against the other tools, the upstreams and the roles, in the order
/// their findings are reported.
fn check_tool(
    t: &Tool,
    tool_index: &ToolIndex,
    tools: &[Tool],
    gateway: &GatewayFile,
    role_names: &HashSet<&str>,
    finding: &mut Sink<'_>,
) {
    let path = format!("tools[{}]", t.index);
    check_tool_links(t, &path, tool_index, finding);
    check_reads(t, &path, tool_index, tools, finding);
    check_reconciler_reads(t, &path, tool_index, tools, finding);
    check_destination_lookups(t, &path, tool_index, finding);
    check_handler(t, &path, gateway, finding);
    check_roles(t, &path, role_names, finding);
    check_named_fields(t, &path, finding);
    check_call_fields(t, &path, finding);
    check_approver_count(t, &path, finding);
}

/// `compensate` and `reconcile` name declared tools.
fn check_tool_links(t: &Tool, path: &str, tool_index: &ToolIndex, finding: &mut Sink<'_>) {
    let c = &t.config;
    for (field, target) in [("compensate", &c.compensate), ("reconcile", &c.reconcile)] {
        if let Some(target) = target
            && !tool_index.contains_key(target)
        {
            finding(
                &t.file,
                format!("{path}.{field}"),
                "ref.dangling",
                format!("'{}' names tool '{target}', which is not declared", c.name),
                format!("declare '{target}' in tools/ or correct the name"),
            );
        }
    }
}

/// A reconciling tool only asks.
fn check_reconciler_reads(
    t: &Tool,
    path: &str,
    tool_index: &ToolIndex,
    tools: &[Tool],
    finding: &mut Sink<'_>,
) {
    if let Some(rec) = &t.config.reconcile
        && let Some(&ri) = tool_index.get(rec)
        && tools[ri].config.effect != crate::model::Effect::Read
    {
        finding(
            &t.file,
            format!("{path}.reconcile"),
            "ref.reconciler-not-read",
            format!("reconciling tool '{rec}' is not a read tool"),
            "a reconciler only asks; give it `effect: read`".into(),
        );
    }
}

/// Each destination lookup names a declared tool.
fn check_destination_lookups(t: &Tool, path: &str, tool_index: &ToolIndex, finding: &mut Sink<'_>) {
    for d in &t.config.destinations {
        if let Some(l) = &d.lookup
            && !tool_index.contains_key(&l.tool)
        {
            finding(
                &t.file,
                format!("{path}.destinations"),
                "ref.dangling",
                format!(
                    "destination lookup names tool '{}', which is not declared",
                    l.tool
                ),
                "declare the read tool that returns the allowed values".into(),
            );
        }
    }
}

/// The handler names exactly one of a declared upstream or a known built-in.
fn check_handler(t: &Tool, path: &str, gateway: &GatewayFile, finding: &mut Sink<'_>) {
    let h = &t.config.handler;
    match (&h.upstream, &h.builtin) {
        (Some(u), None) => {
            if !gateway.upstreams.contains_key(u) {
                let known: Vec<&String> = gateway.upstreams.keys().collect();
                finding(
                    &t.file,
                    format!("{path}.handler.upstream"),
                    "ref.dangling",
                    format!("upstream '{u}' is not declared in toolgate.yaml"),
                    format!("use one of {known:?} or add it under `upstreams:`"),
                );
            }
        }
        (None, Some(b)) => {
            if Builtin::from_name(b).is_none() {
                finding(
                    &t.file,
                    format!("{path}.handler.builtin"),
                    "ref.dangling",
                    format!("'{b}' is not a built-in tool"),
                    format!("built-ins are {:?}", Builtin::ALL.map(Builtin::name)),
                );
            }
        }
        _ => finding(
            &t.file,
            format!("{path}.handler"),
            "config.handler",
            "a handler names exactly one of `upstream` or `builtin`".into(),
            "write `handler: {upstream: erp, tool: schedule_payment}` or `handler: {builtin: plan.submit}`".into(),
        ),
    }
}

/// Each role the tool is listed for is declared or held.
fn check_roles(t: &Tool, path: &str, role_names: &HashSet<&str>, finding: &mut Sink<'_>) {
    for (j, r) in t.config.roles.iter().enumerate() {
        if !role_names.contains(r.as_str()) {
            let mut known: Vec<_> = role_names.iter().collect();
            known.sort();
            finding(
                &t.file,
                format!("{path}.roles[{j}]"),
                "ref.dangling",
                format!("role '{r}' is neither declared under `roles:` nor held by any principal"),
                format!("declare it in principals.yaml `roles:`; known roles: {known:?}"),
            );
        }
    }
}

/// `identity` fields are inputs; `redact` fields are inputs or outputs.
fn check_named_fields(t: &Tool, path: &str, finding: &mut Sink<'_>) {
    let c = &t.config;
    for (j, f) in c.identity.iter().chain(c.redact.iter()).enumerate() {
        let first = f.split('.').next().unwrap_or(f);
        let in_inputs = c
            .input_schema
            .pointer(&format!("/properties/{first}"))
            .is_some();
        let in_outputs = c
            .output_schema
            .as_ref()
            .is_some_and(|o| crate::lint::schema_mentions(o, first));
        let is_identity = j < c.identity.len();
        let declared = in_inputs || (!is_identity && in_outputs);
        if !declared {
            finding(
                &t.file,
                format!("{path}.{}", if is_identity { "identity" } else { "redact" }),
                "ref.unknown-field",
                format!("field '{f}' is not a property of the tool's schema"),
                "name a property declared in input_schema (or output_schema for redact)".into(),
            );
        }
    }
}

/// One person approves, or two (the two-person rule).
fn check_approver_count(t: &Tool, path: &str, finding: &mut Sink<'_>) {
    let approvers = t.config.approvers;
    if !(1..=2).contains(&approvers) {
        finding(
            &t.file,
            format!("{path}.approvers"),
            "config.approvers",
            format!("approvers is {approvers}"),
            "1 (one person) or 2 (two-person rule)".into(),
        );
    }
}

/// The principals under unique ids, with their ancestors, and the principal each credential's
/// key hash belongs to.
struct PrincipalIndex {
    principals: Vec<Principal>,
    by_id: HashMap<String, usize>,
    by_key: HashMap<String, usize>,
}

/// The principals: unique ids, parents that exist and form no cycle, well-formed credentials
/// held once, default purposes they are granted, and no agent in an approver role.
fn index_principals(
    pfile: &PrincipalsFile,
    roles: &BTreeMap<String, RoleConfig>,
    finding: &mut Sink<'_>,
) -> PrincipalIndex {
    let mut principals = Vec::new();
    let mut by_id = HashMap::new();
    for (i, p) in pfile.principals.iter().enumerate() {
        if by_id.contains_key(&p.id) {
            finding(
                "principals.yaml",
                format!("principals[{i}].id"),
                "ref.duplicate",
                format!("principal '{}' is declared twice", p.id),
                "give each principal one entry".into(),
            );
            continue;
        }
        by_id.insert(p.id.clone(), principals.len());
        principals.push(Principal {
            config: p.clone(),
            ancestors: Vec::new(),
            entity: uid("Principal", &p.id),
        });
    }
    let mut by_key = HashMap::new();
    for (i, p) in pfile.principals.iter().enumerate() {
        let ancestors = ancestors_of(i, p, &principals, &by_id, finding);
        if let Some(&pi) = by_id.get(&p.id)
            && principals[pi].config.id == p.id
        {
            principals[pi].ancestors = ancestors;
        }
        check_credentials(i, p, &by_id, &mut by_key, finding);
        check_default_purposes(i, p, finding);
        check_agent_approver(i, p, roles, finding);
    }
    PrincipalIndex {
        principals,
        by_id,
        by_key,
    }
}

/// `p`'s parent, its parent's parent, … up to the root; a cycle or an undeclared parent ends
/// the chain with a finding.
fn ancestors_of(
    i: usize,
    p: &PrincipalConfig,
    principals: &[Principal],
    by_id: &HashMap<String, usize>,
    finding: &mut Sink<'_>,
) -> Vec<String> {
    let mut ancestors = Vec::new();
    let mut cur = p.parent.clone();
    while let Some(parent) = cur {
        if parent == p.id || ancestors.contains(&parent) {
            finding(
                "principals.yaml",
                format!("principals[{i}].parent"),
                "ref.cycle",
                format!("principal '{}' is its own ancestor", p.id),
                "parents form a tree rooted at a principal without a parent".into(),
            );
            break;
        }
        match by_id.get(&parent) {
            Some(&pi) => {
                ancestors.push(parent.clone());
                cur = principals[pi].config.parent.clone();
            }
            None => {
                finding(
                    "principals.yaml",
                    format!("principals[{i}].parent"),
                    "ref.dangling",
                    format!("parent '{parent}' is not a declared principal"),
                    "name a principal declared in this file".into(),
                );
                break;
            }
        }
    }
    ancestors
}

/// Each credential is a key hash, held by no other credential; indexed in `by_key`.
fn check_credentials(
    i: usize,
    p: &PrincipalConfig,
    by_id: &HashMap<String, usize>,
    by_key: &mut HashMap<String, usize>,
    finding: &mut Sink<'_>,
) {
    for (j, c) in p.credentials.iter().enumerate() {
        let ok = c
            .sha256
            .strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
        if !ok {
            finding(
                "principals.yaml",
                format!("principals[{i}].credentials[{j}].sha256"),
                "config.credential",
                "not a `sha256:<64 hex digits>` hash".into(),
                "store the hash of the API key, never the key: `toolgate key hash`".into(),
            );
        } else if by_key
            .insert(c.sha256.to_ascii_lowercase(), by_id[&p.id])
            .is_some()
        {
            finding(
                "principals.yaml",
                format!("principals[{i}].credentials[{j}]"),
                "ref.duplicate",
                "this key hash is already held by another credential".into(),
                "issue each principal its own key".into(),
            );
        }
    }
}

/// A default purpose (the principal's, or a credential's) is one the principal is granted.
fn check_default_purposes(i: usize, p: &PrincipalConfig, finding: &mut Sink<'_>) {
    let granted: HashSet<&str> = p
        .grants
        .iter()
        .flat_map(|g| g.purposes.iter().map(String::as_str))
        .collect();
    let defaults = std::iter::once((
        format!("principals[{i}].default_purpose"),
        &p.default_purpose,
    ))
    .chain(p.credentials.iter().enumerate().map(|(j, c)| {
        (
            format!("principals[{i}].credentials[{j}].default_purpose"),
            &c.default_purpose,
        )
    }));
    for (at, purpose) in defaults {
        if let Some(purpose) = purpose
            && !granted.contains(purpose.as_str())
        {
            let mut names: Vec<_> = granted.iter().collect();
            names.sort();
            finding(
                "principals.yaml",
                at,
                "config.default-purpose",
                format!("'{}' has no grant for purpose '{purpose}'", p.id),
                format!("name one of its granted purposes: {names:?}"),
            );
        }
    }
}

/// Only people approve.
fn check_agent_approver(
    i: usize,
    p: &PrincipalConfig,
    roles: &BTreeMap<String, RoleConfig>,
    finding: &mut Sink<'_>,
) {
    if p.kind == PrincipalKind::Agent && roles.get(&p.role).is_some_and(|r| r.approver) {
        finding(
            "principals.yaml",
            format!("principals[{i}].role"),
            "config.agent-approver",
            format!("agent '{}' holds approver role '{}'", p.id, p.role),
            "only people (kind: human) approve; a model reviewer uses step.approve".into(),
        );
    }
}

/// A role's default purpose is one some principal of the role is granted.
fn check_role_defaults(
    roles: &BTreeMap<String, RoleConfig>,
    pfile: &PrincipalsFile,
    finding: &mut Sink<'_>,
) {
    for (name, r) in roles {
        if let Some(purpose) = &r.default_purpose {
            let held = pfile
                .principals
                .iter()
                .any(|p| &p.role == name && p.grants.iter().any(|g| g.purposes.contains(purpose)));
            if !held {
                finding(
                    "principals.yaml",
                    format!("roles.{name}.default_purpose"),
                    "config.default-purpose",
                    format!("no principal of role '{name}' has a grant for purpose '{purpose}'"),
                    "name a purpose the role's principals are granted".into(),
                );
            }
        }
    }
}

/// `runs.idle_minutes` is between a minute and a week.
fn check_runs(gateway: &GatewayFile, finding: &mut Sink<'_>) {
    if !(1..=10_080).contains(&gateway.runs.idle_minutes) {
        finding(
            "toolgate.yaml",
            "runs.idle_minutes".into(),
            "config.bounds",
            format!("idle_minutes is {}", gateway.runs.idle_minutes),
            "between 1 and 10080 (a week); the default is 30".into(),
        );
    }
}

/// Each tool's window budgets, compiled: fields and keys exist, limits parse, ids are unique
/// across tools.
fn compile_window_budgets(tools: &mut [Tool], pfile: &PrincipalsFile, finding: &mut Sink<'_>) {
    let declared: HashSet<&str> = pfile.principals.iter().map(|p| p.id.as_str()).collect();
    let mut budget_ids: HashMap<String, String> = HashMap::new();
    let mut budget_findings = Vec::new();
    for t in tools {
        t.windows = crate::budget::compile(
            &t.file,
            t.index,
            &t.config.window_budgets,
            &t.config.input_schema,
            &declared,
            &mut budget_findings,
        );
        for (j, b) in t.config.window_budgets.iter().enumerate() {
            if let Some(other) = budget_ids.insert(b.id.clone(), t.config.name.clone()) {
                budget_findings.push(Finding {
                    file: t.file.clone(),
                    path: format!("tools[{}].window_budgets[{j}].id", t.index),
                    rule: "ref.duplicate".into(),
                    message: format!("window budget '{}' is also declared on '{other}'", b.id),
                    fix: "give each window budget its own id".into(),
                });
            }
        }
    }
    for f in budget_findings {
        finding(&f.file, f.path, &f.rule, f.message, f.fix);
    }
}

/// The policies, validated against the Cedar schema generated from the tools; `None` when any
/// does not validate.
fn load_policies(
    policy_files: &[(String, String)],
    tools: &[Tool],
    pfile: &PrincipalsFile,
    finding: &mut Sink<'_>,
) -> Option<Policies> {
    let configs: Vec<ToolConfig> = tools.iter().map(|t| t.config.clone()).collect();
    let types: Vec<&CedarType> = tools.iter().map(|t| t.schema.cedar_type()).collect();
    match Policies::load(policy_files, &configs, &types, &pfile.principals) {
        Ok(p) => Some(p),
        Err(problems) => {
            for p in problems {
                finding(
                    &p.file,
                    p.policy.unwrap_or_else(|| "(file)".into()),
                    "policy.invalid",
                    p.message,
                    p.fix.unwrap_or_else(|| {
                        "policies see context.purpose, context.reason, context.inputs.<field> \
                         (typed from the tool's schema) and context.run.{steps,denials,\
                         act_steps,spend_steps,tool_calls}; `toolgate check --cedar-schema` \
                         prints the schema"
                            .into()
                    }),
                );
            }
            None
        }
    }
}

/// Who may approve each gate: enough eligible people, none approving their own requests.
fn check_approvals(
    gateway: &GatewayFile,
    tools: &[Tool],
    pfile: &PrincipalsFile,
    policies: Option<&Policies>,
    finding: &mut Sink<'_>,
) {
    let tool_configs: Vec<(&str, usize, &ToolConfig)> = tools
        .iter()
        .map(|t| (t.file.as_str(), t.index, &t.config))
        .collect();
    for f in crate::approvers::check(gateway, &tool_configs, pfile, policies) {
        finding(&f.file, f.path, &f.rule, f.message, f.fix);
    }
}

/// The checks of a tool's `ask`, `reason_from`, `reason_length` and `idempotency`.
fn check_call_fields(t: &Tool, path: &str, finding: &mut Sink<'_>) {
    use crate::config::CallField;
    let c = &t.config;
    let own = |name: &str| c.input_schema.pointer(&format!("/properties/{name}"));
    for field in c.ask.iter().flatten() {
        if own(field.as_str()).is_some() {
            finding(
                &t.file,
                format!("{path}.ask"),
                "config.ask-conflict",
                format!(
                    "'{}' is an input of the tool's own, so toolgate cannot ask for it as its own argument",
                    field.as_str()
                ),
                match field {
                    CallField::Reason => "drop it from `ask`; to use that input as the call's reason, write `reason_from: reason`".into(),
                    CallField::Purpose => "drop it from `ask`; callers then give the purpose in _meta or through a default".into(),
                },
            );
        }
    }
    if let Some(f) = &c.reason_from {
        let is_string =
            own(f).is_some_and(|p| p.get("type").and_then(Value::as_str) == Some("string"));
        if !is_string {
            finding(
                &t.file,
                format!("{path}.reason_from"),
                "ref.unknown-field",
                format!(
                    "reason_from names '{f}', which is not a string property of the tool's inputs"
                ),
                "name a top-level `type: string` property of input_schema".into(),
            );
        }
        if c.ask.iter().flatten().any(|x| *x == CallField::Reason) {
            finding(
                &t.file,
                format!("{path}.ask"),
                "config.ask-conflict",
                "the reason is asked for as an argument and also read from an input".into(),
                "keep one: `reason_from` or `ask: [reason]`".into(),
            );
        }
    }
    if let Some(b) = c.reason_length
        && (b.min == 0 || b.min > b.max || b.max > 10_000)
    {
        finding(
            &t.file,
            format!("{path}.reason_length"),
            "config.bounds",
            format!("reason_length is {}..{}", b.min, b.max),
            "1 <= min <= max <= 10000 characters; the default is {min: 10, max: 500}".into(),
        );
    }
    if c.idempotency.replay == Some(false) && c.effect != crate::model::Effect::Read {
        finding(
            &t.file,
            format!("{path}.idempotency.replay"),
            "config.replay",
            format!(
                "'{}' changes state, so a repeated call must replay the first one's outcome",
                c.name
            ),
            "remove `replay: false`; only reads may be run again".into(),
        );
    }
    if let Some(h) = c.idempotency.retention_hours
        && !(1..=24 * 366).contains(&h)
    {
        finding(
            &t.file,
            format!("{path}.idempotency.retention_hours"),
            "config.bounds",
            format!("retention_hours is {h}"),
            "between 1 and 8784 (a year)".into(),
        );
    }
}

/// The checks of a tool's `reconcile_query` and `compensate_with`: the read tools they name
/// are declared reads, and the fields they take from the call are its inputs.
fn check_reads(
    t: &Tool,
    path: &str,
    tool_index: &HashMap<String, usize>,
    tools: &[Tool],
    finding: &mut Sink<'_>,
) {
    use crate::model::Effect;
    let c = &t.config;
    let is_input = |f: &str| {
        c.input_schema
            .pointer(&format!("/properties/{f}"))
            .is_some()
    };
    let read_tool =
        |at: String, name: &str, finding: &mut dyn FnMut(&str, String, &str, String, String)| {
            match tool_index.get(name) {
            None => finding(
                &t.file,
                at,
                "ref.dangling",
                format!("'{}' names tool '{name}', which is not declared", c.name),
                format!("declare '{name}' in tools/ or correct the name"),
            ),
            Some(&i) if tools[i].config.effect != Effect::Read => finding(
                &t.file,
                at,
                "ref.reconciler-not-read",
                format!("'{name}' is not a read tool"),
                "it is asked on the call's behalf, so it may only observe: give it `effect: read`"
                    .into(),
            ),
            Some(_) => {}
        }
        };
    let fields = |at: String,
                  names: &crate::config::FieldNames,
                  finding: &mut dyn FnMut(&str, String, &str, String, String)| {
        for (_, input) in names.pairs() {
            if !is_input(input) {
                finding(
                    &t.file,
                    at.clone(),
                    "ref.unknown-field",
                    format!("'{input}' is not an input of '{}'", c.name),
                    "name top-level properties of the tool's input_schema".into(),
                );
            }
        }
    };
    if let Some(q) = &c.reconcile_query {
        let at = format!("{path}.reconcile_query");
        read_tool(format!("{at}.tool"), &q.tool, finding);
        fields(format!("{at}.with"), &q.with, finding);
        fields(format!("{at}.match"), &q.match_fields, finding);
        if q.match_fields.is_empty() {
            finding(
                &t.file,
                format!("{at}.match"),
                "config.reconcile",
                "a reconciling query with nothing to match would take any item for this call".into(),
                "list the fields that identify the call in the answer: `match: [recipient, amount, subject]`".into(),
            );
        }
        if c.reconcile.is_some() {
            finding(
                &t.file,
                at.clone(),
                "config.reconcile",
                format!("'{}' declares both `reconcile` and `reconcile_query`", c.name),
                "keep one: `reconcile` when the target answers by idempotency key, `reconcile_query` when it does not".into(),
            );
        }
        if c.effect != Effect::Irreversible {
            finding(
                &t.file,
                at,
                "config.reconcile",
                format!(
                    "'{}' is a {} tool; only an irreversible call is reconciled",
                    c.name, c.effect
                ),
                "remove `reconcile_query`, or declare the tool `effect: irreversible`".into(),
            );
        }
    }
    if let Some(w) = &c.compensate_with {
        let at = format!("{path}.compensate_with");
        read_tool(format!("{at}.read"), &w.read, finding);
        fields(format!("{at}.with"), &w.with, finding);
        if let Some(pick) = &w.pick {
            fields(format!("{at}.pick"), pick, finding);
        }
        fields(format!("{at}.restore"), &w.restore, finding);
        if w.restore.is_empty() {
            finding(
                &t.file,
                format!("{at}.restore"),
                "config.compensate",
                "nothing to restore: the compensation would repeat the call".into(),
                "list the inputs the call changes: `restore: [street, city]`".into(),
            );
        }
        if c.compensate.is_some() {
            finding(
                &t.file,
                at.clone(),
                "config.compensate",
                format!("'{}' declares both `compensate` and `compensate_with`", c.name),
                "keep one: `compensate` names another tool that undoes it; `compensate_with` undoes it with the same tool and the previous values".into(),
            );
        }
        if c.effect != Effect::Write {
            finding(
                &t.file,
                at,
                "config.compensate",
                format!(
                    "'{}' is a {} tool; only a write is compensated",
                    c.name, c.effect
                ),
                "remove `compensate_with`, or declare the tool `effect: write`".into(),
            );
        }
    }
}

/// The checks of `accept:` entries that need no lint: each names a rule that can be accepted,
/// a subject, a reason and who accepted it. Whether it still matches a finding is the lint's
/// question (`accept.stale`).
fn check_acceptances(gateway: &GatewayFile, finding: &mut Sink<'_>) {
    for (i, a) in gateway.accept.iter().enumerate() {
        let at = format!("accept[{i}]");
        if !crate::rules::acceptable(&a.rule) {
            finding(
                "toolgate.yaml",
                format!("{at}.rule"),
                "config.accept",
                format!("'{}' is not a lint rule that can be accepted", a.rule),
                format!(
                    "name one of: {} (a load error is fixed, never accepted)",
                    crate::rules::LINT_RULES
                        .iter()
                        .filter(|r| crate::rules::acceptable(r.id))
                        .map(|r| r.id)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        for (field, value, want) in [
            (
                "subject",
                &a.subject,
                "the tool, principal or policy `toolgate check` names",
            ),
            (
                "reason",
                &a.reason,
                "why the finding is acceptable here, for the next reviewer",
            ),
            (
                "by",
                &a.by,
                "who accepted it: a CODEOWNERS handle or an email address",
            ),
        ] {
            if value.trim().is_empty() {
                finding(
                    "toolgate.yaml",
                    format!("{at}.{field}"),
                    "config.accept",
                    format!("an acceptance without a {field}"),
                    format!("give {want}"),
                );
            }
        }
    }
}

/// `sha256:<hex>` of an API key: what `principals.yaml` stores.
pub fn api_key_hash(api_key: &str) -> String {
    sha256_tagged(api_key.as_bytes())
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
