//! The in-memory object store: one cluster-wide resourceVersion, objects kept with their serialized
//! bytes (so a 10,000-object list is a concatenation, not a serialization), a bounded history of
//! changes per resource for watches that resume from a resourceVersion, and the open watch channels.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::resources::ResourceType;
use super::selector::Filter;
use super::status::ApiError;

/// An object as stored: its JSON, the same JSON serialized, and its resourceVersion.
#[derive(Debug)]
pub(crate) struct Stored {
    pub value: Value,
    pub bytes: Bytes,
    pub rv: u64,
    /// The `PartialObjectMetadata` rendering, made on first use (metadata-only clients).
    pub metadata_bytes: std::sync::OnceLock<Bytes>,
}

impl Stored {
    fn new(value: Value, rv: u64) -> Result<Arc<Self>, ApiError> {
        let bytes = serde_json::to_vec(&value)
            .map_err(|e| ApiError::internal(format!("serializing object: {e}")))?;
        Ok(Arc::new(Self {
            value,
            bytes: Bytes::from(bytes),
            rv,
            metadata_bytes: std::sync::OnceLock::new(),
        }))
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One entry of a resource's history, sent to its watchers.
#[derive(Debug)]
pub(crate) struct Change {
    pub kind: ChangeKind,
    /// The object after the change (for `Deleted`: its last state, with the deletion's resourceVersion).
    pub object: Arc<Stored>,
    /// The object before the change, so that a watch with a selector can turn a change that makes an
    /// object match or stop matching into `ADDED` / `DELETED`, as the apiserver does.
    pub previous: Option<Arc<Stored>>,
}

type Key = (String, String);

#[derive(Debug, Default)]
struct Collection {
    objects: BTreeMap<Key, Arc<Stored>>,
    history: VecDeque<Arc<Change>>,
    /// Watches must start at or after this resourceVersion; older ones answer 410.
    compacted_through: u64,
    watchers: Vec<mpsc::UnboundedSender<Arc<Change>>>,
}

/// The first page of a paginated list, kept so that later pages show the same snapshot.
#[derive(Debug)]
struct Snapshot {
    id: u64,
    rv: u64,
    items: Arc<Vec<Arc<Stored>>>,
}

/// How many paginated-list snapshots are kept; an older continue token answers 410.
const SNAPSHOTS_KEPT: usize = 64;

/// A list (or one page of it).
#[derive(Debug)]
pub(crate) struct ListPage {
    pub rv: u64,
    pub items: Vec<Arc<Stored>>,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchFrom {
    /// Send the current objects as `ADDED`, then changes (resourceVersion unset or `0`).
    Current,
    /// Send changes after this resourceVersion.
    After(u64),
}

/// A registered watch: what to send first, and the channel of later changes.
#[derive(Debug)]
pub(crate) struct WatchStart {
    pub rv: u64,
    pub initial: Vec<Arc<Stored>>,
    pub backlog: Vec<Arc<Change>>,
    pub rx: mpsc::UnboundedReceiver<Arc<Change>>,
}

/// Delete preconditions (`DeleteOptions.preconditions`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// The object store of one server.
#[derive(Debug)]
pub(crate) struct Store {
    rv: u64,
    collections: HashMap<(&'static str, &'static str), Collection>,
    history_limit: usize,
    snapshots: VecDeque<Snapshot>,
    next_snapshot: u64,
    entropy: u64,
}

fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let secs = i64::try_from(secs).unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

fn meta(v: &Value) -> Option<&Map<String, Value>> {
    v.get("metadata").and_then(Value::as_object)
}

fn meta_mut(v: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body is not a JSON object"))?;
    let m = obj.entry("metadata").or_insert_with(|| json!({}));
    if m.is_null() {
        *m = json!({});
    }
    m.as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata is not an object"))
}

pub(crate) fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    meta(v).and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// The storage key (namespace, name) of an object.
fn key_of(v: &Value) -> Key {
    (
        meta_str(v, "namespace").unwrap_or_default().to_string(),
        meta_str(v, "name").unwrap_or_default().to_string(),
    )
}

/// Whether `name` is a DNS-1123 subdomain (the rule for most object names).
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9);
        Self {
            rv: 1,
            collections: HashMap::new(),
            history_limit: history_limit.max(1),
            snapshots: VecDeque::new(),
            next_snapshot: 1,
            entropy: seed,
        }
    }

    /// The cluster-wide resourceVersion of the last change.
    pub fn current_rv(&self) -> u64 {
        self.rv
    }

    fn random(&mut self) -> u64 {
        // splitmix64: uids and generated names need to be unique, not unpredictable.
        self.entropy = self.entropy.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.entropy;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn new_uid(&mut self) -> String {
        let a = self.random();
        let b = self.random();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0x0fff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    fn generated_suffix(&mut self) -> String {
        // The apiserver's alphabet for generateName: no vowels, no confusable characters.
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = self.random();
        (0..5)
            .map(|_| {
                let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
                r /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    fn coll(&mut self, rt: &ResourceType) -> &mut Collection {
        self.collections.entry(rt.key()).or_default()
    }

    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Option<Arc<Stored>> {
        self.collections
            .get(&rt.key())
            .and_then(|c| c.objects.get(&(namespace.to_string(), name.to_string())))
            .cloned()
    }

    /// All objects of a type that pass the filter, in key order, and the current resourceVersion.
    pub fn list(&self, rt: &ResourceType, filter: &Filter) -> (u64, Vec<Arc<Stored>>) {
        let Some(c) = self.collections.get(&rt.key()) else {
            return (self.rv, Vec::new());
        };
        let items = match &filter.namespace {
            Some(ns) => c
                .objects
                .range((ns.clone(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v)
                .filter(|s| filter.selects_all() || filter.matches(&s.value))
                .cloned()
                .collect(),
            None => c
                .objects
                .values()
                .filter(|s| filter.selects_all() || filter.matches(&s.value))
                .cloned()
                .collect(),
        };
        (self.rv, items)
    }

    /// One page of a list: the first page snapshots the result, later pages read the snapshot.
    pub fn list_page(
        &mut self,
        rt: &ResourceType,
        filter: &Filter,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<ListPage, ApiError> {
        let (rv, items, offset, snapshot_id) = match continue_token {
            Some(token) => {
                let parsed = parse_continue(token).ok_or_else(|| {
                    ApiError::bad_request(format!("continue key is not valid: {token:?}"))
                })?;
                let snap = self.snapshots.iter().find(|s| s.id == parsed.0).ok_or_else(|| {
                    ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    )
                })?;
                (snap.rv, snap.items.clone(), parsed.1, Some(snap.id))
            }
            None => {
                let (rv, items) = self.list(rt, filter);
                (rv, Arc::new(items), 0, None)
            }
        };
        let total = items.len();
        let end = match limit {
            Some(l) if l > 0 => offset.saturating_add(l).min(total),
            _ => total,
        };
        let start = offset.min(total);
        let page: Vec<Arc<Stored>> = items[start..end].to_vec();
        let continue_token = if end < total {
            let id = match snapshot_id {
                Some(id) => id,
                None => {
                    let id = self.next_snapshot;
                    self.next_snapshot += 1;
                    self.snapshots.push_back(Snapshot { id, rv, items });
                    while self.snapshots.len() > SNAPSHOTS_KEPT {
                        self.snapshots.pop_front();
                    }
                    id
                }
            };
            Some(format!("{id}.{end}.{rv}"))
        } else {
            None
        };
        let remaining = continue_token
            .as_ref()
            .filter(|_| filter.selects_all())
            .map(|_| total - end);
        Ok(ListPage {
            rv,
            items: page,
            continue_token,
            remaining,
        })
    }

    /// Records a change: bumps the resourceVersion, stores or removes the object, appends to the
    /// history (dropping the oldest entry past the limit) and sends it to the watchers.
    fn commit(
        &mut self,
        rt: &ResourceType,
        kind: ChangeKind,
        mut value: Value,
        previous: Option<Arc<Stored>>,
    ) -> Result<Arc<Stored>, ApiError> {
        let rv = self.rv + 1;
        meta_mut(&mut value)?.insert("resourceVersion".into(), json!(rv.to_string()));
        let stored = Stored::new(value, rv)?;
        self.rv = rv;
        let limit = self.history_limit;
        let c = self.coll(rt);
        let key = key_of(&stored.value);
        if kind == ChangeKind::Deleted {
            c.objects.remove(&key);
        } else {
            c.objects.insert(key, stored.clone());
        }
        let change = Arc::new(Change {
            kind,
            object: stored.clone(),
            previous,
        });
        c.history.push_back(change.clone());
        while c.history.len() > limit {
            if let Some(old) = c.history.pop_front() {
                c.compacted_through = old.object.rv;
            }
        }
        c.watchers.retain(|tx| tx.send(change.clone()).is_ok());
        Ok(stored)
    }

    /// Creates an object: sets name (from `generateName`), uid, creationTimestamp, generation.
    pub fn create(&mut self, rt: &ResourceType, mut value: Value) -> Result<Arc<Stored>, ApiError> {
        let name = meta_str(&value, "name").unwrap_or_default().to_string();
        let name = if name.is_empty() {
            match meta_str(&value, "generateName") {
                Some(prefix) if !prefix.is_empty() => {
                    format!("{prefix}{}", self.generated_suffix())
                }
                _ => {
                    return Err(ApiError::invalid(
                        rt,
                        "",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    ));
                }
            }
        } else {
            name
        };
        if !is_dns_subdomain(&name) {
            return Err(ApiError::invalid(
                rt,
                &name,
                "metadata.name",
                &format!(
                    "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        let uid = self.new_uid();
        let namespace = meta_str(&value, "namespace")
            .unwrap_or_default()
            .to_string();
        if self.get(rt, &namespace, &name).is_some() {
            return Err(ApiError::already_exists(rt, &name));
        }
        if let Some(obj) = value.as_object_mut() {
            obj.insert("kind".into(), json!(rt.kind));
            obj.insert("apiVersion".into(), json!(rt.api_version()));
        }
        let m = meta_mut(&mut value)?;
        m.insert("name".into(), json!(name));
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        if m.get("labels").is_some_and(Value::is_null) {
            m.remove("labels");
        }
        if m.get("annotations").is_some_and(Value::is_null) {
            m.remove("annotations");
        }
        self.commit(rt, ChangeKind::Added, value, None)
    }

    /// Read-modify-write of one object. `change` gets the current object and returns the new one;
    /// the server-owned fields are then restored, a stale `metadata.resourceVersion` in the result
    /// answers 409, an unchanged object is not written (no new resourceVersion, no event), and an
    /// object being deleted whose last finalizer went away is removed.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Stored>, ApiError> {
        let old = self
            .get(rt, namespace, name)
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        let mut new = change(&old.value)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the object is not a JSON object"));
        }
        if let Some(rv) = meta_str(&new, "resourceVersion")
            && !rv.is_empty()
            && rv != old.rv.to_string()
        {
            return Err(ApiError::modified(rt, name));
        }
        for field in ["name", "namespace"] {
            let was = meta_str(&old.value, field).unwrap_or_default();
            let now = meta_str(&new, field).unwrap_or(was);
            if was != now {
                return Err(ApiError::invalid(
                    rt,
                    name,
                    &format!("metadata.{field}"),
                    &format!("Invalid value: {now:?}: field is immutable"),
                ));
            }
        }
        if let Some(obj) = new.as_object_mut() {
            obj.insert("kind".into(), json!(rt.kind));
            obj.insert("apiVersion".into(), json!(rt.api_version()));
        }
        let old_meta = meta(&old.value).cloned().unwrap_or_default();
        let spec_changed = old.value.get("spec") != new.get("spec");
        let m = meta_mut(&mut new)?;
        m.insert("name".into(), json!(name));
        if rt.namespaced {
            m.insert("namespace".into(), json!(namespace));
        }
        for owned in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            match old_meta.get(owned) {
                Some(v) => m.insert(owned.into(), v.clone()),
                None => m.remove(owned),
            };
        }
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        m.insert(
            "generation".into(),
            json!(if spec_changed {
                generation + 1
            } else {
                generation
            }),
        );
        m.insert("resourceVersion".into(), json!(old.rv.to_string()));
        for map in ["labels", "annotations"] {
            if m.get(map).is_some_and(Value::is_null) {
                m.remove(map);
            }
        }
        let finalizers_left = m
            .get("finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let being_deleted = m.contains_key("deletionTimestamp");
        if new == old.value {
            return Ok(old);
        }
        if being_deleted && !finalizers_left {
            return self.commit(rt, ChangeKind::Deleted, new, Some(old));
        }
        self.commit(rt, ChangeKind::Modified, new, Some(old))
    }

    /// Deletes an object, or — when it has finalizers — marks it with a deletionTimestamp.
    /// Returns the object and whether it is gone.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        pre: &Preconditions,
    ) -> Result<(Arc<Stored>, bool), ApiError> {
        let old = self
            .get(rt, namespace, name)
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        if let Some(uid) = &pre.uid {
            let actual = meta_str(&old.value, "uid").unwrap_or_default();
            if uid != actual {
                return Err(ApiError::conflict(
                    rt,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(rv) = &pre.resource_version
            && *rv != old.rv.to_string()
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    old.rv
                ),
            ));
        }
        let has_finalizers = meta(&old.value)
            .and_then(|m| m.get("finalizers"))
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if meta_str(&old.value, "deletionTimestamp").is_some() {
                return Ok((old, false));
            }
            let mut marked = old.value.clone();
            let m = meta_mut(&mut marked)?;
            m.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            let stored = self.commit(rt, ChangeKind::Modified, marked, Some(old))?;
            return Ok((stored, false));
        }
        let stored = self.commit(rt, ChangeKind::Deleted, old.value.clone(), Some(old))?;
        Ok((stored, true))
    }

    /// Registers a watch. A resourceVersion older than the kept history answers 410 Expired.
    pub fn watch(
        &mut self,
        rt: &ResourceType,
        from: WatchFrom,
        filter: &Filter,
    ) -> Result<WatchStart, ApiError> {
        let current = self.rv;
        let (initial, backlog) = match from {
            WatchFrom::Current => (self.list(rt, filter).1, Vec::new()),
            WatchFrom::After(rv) => {
                let c = self.coll(rt);
                if rv < c.compacted_through {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        c.compacted_through
                    )));
                }
                let backlog = c
                    .history
                    .iter()
                    .filter(|ch| ch.object.rv > rv)
                    .cloned()
                    .collect();
                (Vec::new(), backlog)
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.coll(rt).watchers.push(tx);
        Ok(WatchStart {
            rv: current,
            initial,
            backlog,
            rx,
        })
    }

    /// Ends every open watch stream; returns how many were open.
    pub fn close_watches(&mut self) -> usize {
        self.collections
            .values_mut()
            .map(|c| {
                let n = c.watchers.iter().filter(|w| !w.is_closed()).count();
                c.watchers.clear();
                n
            })
            .sum()
    }

    /// Open watch streams on a type.
    pub fn watcher_count(&self, rt: &ResourceType) -> usize {
        self.collections
            .get(&rt.key())
            .map_or(0, |c| c.watchers.iter().filter(|w| !w.is_closed()).count())
    }

    /// Forgets every type's history (as etcd compaction does): a watch from an older
    /// resourceVersion then answers 410.
    pub fn compact(&mut self) {
        let rv = self.rv;
        for c in self.collections.values_mut() {
            c.history.clear();
            c.compacted_through = rv;
        }
        self.snapshots.clear();
    }

    /// Stores an object as given (server fields filled when missing), bypassing create/update
    /// rules: for seeding test state. Emits ADDED or MODIFIED like any change.
    pub fn seed(&mut self, rt: &ResourceType, mut value: Value) -> Result<Arc<Stored>, ApiError> {
        if !rt.namespaced {
            meta_mut(&mut value)?.remove("namespace");
        }
        let (namespace, name) = key_of(&value);
        if name.is_empty() {
            return Err(ApiError::bad_request("seeded object has no metadata.name"));
        }
        if rt.namespaced && namespace.is_empty() {
            return Err(ApiError::bad_request(format!(
                "seeded {} {name:?} has no metadata.namespace",
                rt.kind
            )));
        }
        let previous = self.get(rt, &namespace, &name);
        let uid = self.new_uid();
        if let Some(obj) = value.as_object_mut() {
            obj.insert("kind".into(), json!(rt.kind));
            obj.insert("apiVersion".into(), json!(rt.api_version()));
        }
        let m = meta_mut(&mut value)?;
        let keep = |m: &mut Map<String, Value>, k: &str, v: Value| {
            if m.get(k).is_none_or(Value::is_null) {
                m.insert(k.into(), v);
            }
        };
        let old_uid = previous
            .as_ref()
            .and_then(|p| meta_str(&p.value, "uid"))
            .map_or(uid, str::to_string);
        keep(m, "uid", json!(old_uid));
        keep(m, "creationTimestamp", json!(now_rfc3339()));
        keep(m, "generation", json!(1));
        let kind = if previous.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.commit(rt, kind, value, previous)
    }

    /// Removes an object directly (seeding helper); emits DELETED.
    pub fn remove(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Stored>> {
        let old = self.get(rt, namespace, name)?;
        self.commit(rt, ChangeKind::Deleted, old.value.clone(), Some(old))
            .ok()
    }
}

/// `<snapshot id>.<offset>.<resourceVersion>`
fn parse_continue(token: &str) -> Option<(u64, usize)> {
    let mut parts = token.split('.');
    let id = parts.next()?.parse().ok()?;
    let offset = parts.next()?.parse().ok()?;
    let _rv: u64 = parts.next()?.parse().ok()?;
    Some((id, offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;

    fn node(name: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"a": "b"}}})
    }

    #[test]
    fn history_is_bounded_and_older_watches_expire() {
        let rt = lookup("", "v1", "nodes").unwrap();
        let mut store = Store::new(3);
        for i in 0..5 {
            store.create(rt, node(&format!("n{i}"))).unwrap();
        }
        let current = store.current_rv();
        // Only the last 3 changes are kept: a watch must start at or after the 2nd change.
        let oldest_ok = current - 3;
        let w = store
            .watch(rt, WatchFrom::After(oldest_ok), &Filter::default())
            .unwrap();
        assert_eq!(w.backlog.len(), 3);
        let err = store
            .watch(rt, WatchFrom::After(oldest_ok - 1), &Filter::default())
            .unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        store.compact();
        let err = store
            .watch(rt, WatchFrom::After(current - 1), &Filter::default())
            .unwrap_err();
        assert_eq!(err.code, 410);
        assert!(
            store
                .watch(rt, WatchFrom::After(current), &Filter::default())
                .is_ok()
        );
    }

    #[test]
    fn continue_tokens_read_a_snapshot_and_expire() {
        let rt = lookup("", "v1", "nodes").unwrap();
        let mut store = Store::new(100);
        for i in 0..5 {
            store.create(rt, node(&format!("n{i}"))).unwrap();
        }
        let first = store
            .list_page(rt, &Filter::default(), Some(2), None)
            .unwrap();
        let token = first.continue_token.unwrap();
        store.remove(rt, "", "n4");
        let second = store
            .list_page(rt, &Filter::default(), Some(10), Some(&token))
            .unwrap();
        assert_eq!(second.items.len(), 3);
        assert_eq!(second.rv, first.rv);
        assert!(second.continue_token.is_none());
        for _ in 0..SNAPSHOTS_KEPT {
            store
                .list_page(rt, &Filter::default(), Some(1), None)
                .unwrap();
        }
        let err = store
            .list_page(rt, &Filter::default(), Some(2), Some(&token))
            .unwrap_err();
        assert_eq!(err.code, 410);
        let err = store
            .list_page(rt, &Filter::default(), Some(2), Some("garbage"))
            .unwrap_err();
        assert_eq!(err.code, 400);
    }

    #[test]
    fn unchanged_update_writes_nothing_and_stale_version_conflicts() {
        let rt = lookup("", "v1", "nodes").unwrap();
        let mut store = Store::new(10);
        let created = store.create(rt, node("n")).unwrap();
        let same = store.update(rt, "", "n", |old| Ok(old.clone())).unwrap();
        assert_eq!(same.rv, created.rv);
        let err = store
            .update(rt, "", "n", |old| {
                let mut v = old.clone();
                v["metadata"]["resourceVersion"] = json!("1");
                v["metadata"]["labels"]["a"] = json!("c");
                Ok(v)
            })
            .unwrap_err();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
        let err = store
            .update(rt, "", "n", |old| {
                let mut v = old.clone();
                v["metadata"]["name"] = json!("other");
                Ok(v)
            })
            .unwrap_err();
        assert_eq!(err.code, 422);
    }
}
