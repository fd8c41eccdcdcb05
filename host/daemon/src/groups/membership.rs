//! One consumer group's membership under the classic rebalance protocol: who is in it, which
//! generation it is at, and the JoinGroup / SyncGroup rounds that move it from one generation
//! to the next. Pure: every call takes the time, and waiting callers get a channel to await,
//! so the rules are tested without a network or a clock.
//!
//! States, as a Kafka broker names them:
//! - `Empty`: no members (offsets may still be committed to it by consumers that assign
//!   partitions themselves);
//! - `PreparingRebalance`: collecting JoinGroups; it completes when every member has joined
//!   again (and, for a group that was empty, the initial delay has passed), or at the
//!   rebalance deadline, when members that did not join are removed;
//! - `CompletingRebalance`: the generation is chosen and the leader (one member) assigns
//!   partitions; the others wait in SyncGroup for what the leader sends;
//! - `Stable`: every member has its assignment and heartbeats.
//!
//! A member whose heartbeats stop for its session timeout is removed, and the others
//! rebalance. Commits and heartbeats name the member and generation: a member removed, or one
//! of an older generation, is refused (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION), which is what
//! keeps a zombie consumer from committing over its successor. The coordinator only relays
//! the assignment: range, round-robin, sticky and cooperative-sticky all run in the clients.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

/// Kafka error codes the group protocol answers with (the numbers clients expect).
pub(crate) mod code {
    /// No error.
    pub(crate) const NONE: i16 = 0;
    /// The member id is not (or no longer) in the group.
    pub(crate) const UNKNOWN_MEMBER_ID: i16 = 25;
    /// The generation named is not the group's.
    pub(crate) const ILLEGAL_GENERATION: i16 = 22;
    /// The member's protocols share none with the group's, or its protocol type differs.
    pub(crate) const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    /// The session timeout is outside what the coordinator allows.
    pub(crate) const INVALID_SESSION_TIMEOUT: i16 = 26;
    /// A rebalance is under way: join again.
    pub(crate) const REBALANCE_IN_PROGRESS: i16 = 27;
    /// Join again with the member id in the answer (JoinGroup v4 and later).
    pub(crate) const MEMBER_ID_REQUIRED: i16 = 79;
    /// The group has as many members as it may.
    pub(crate) const GROUP_MAX_SIZE_REACHED: i16 = 81;
    /// The group still has members (DeleteGroups).
    pub(crate) const NON_EMPTY_GROUP: i16 = 68;
    /// The group id is empty or invalid.
    pub(crate) const INVALID_GROUP_ID: i16 = 24;
    /// The coordinator cannot take the request now (shutting down, partition moving): retry.
    pub(crate) const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    /// This node is not the group's coordinator: find it again.
    pub(crate) const NOT_COORDINATOR: i16 = 16;
    /// The coordinator is still reading the group's offsets: retry.
    pub(crate) const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    /// The group does not exist (DeleteGroups, DescribeGroups of an unknown id).
    pub(crate) const GROUP_ID_NOT_FOUND: i16 = 69;
}

/// Session timeouts a member may ask for: Kafka's broker defaults are 6 s to 30 min; the
/// floor here is lower so tests (and impatient deployments) can see a death sooner.
pub(crate) const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(1_000);
/// Longest session timeout a member may ask for (Kafka's default maximum).
pub(crate) const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Most members (joined or holding a member id) in one group: a bound on what one client
/// can make the coordinator hold.
pub(crate) const MAX_MEMBERS: usize = 1_000;
/// Most bytes of protocol metadata and assignments one group holds.
pub(crate) const MAX_GROUP_BYTES: usize = 64 << 20;

/// The group's state (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// No members.
    Empty,
    /// Collecting JoinGroups.
    PreparingRebalance,
    /// Waiting for the leader's assignment.
    CompletingRebalance,
    /// Assigned and heartbeating.
    Stable,
}

impl State {
    /// The name Kafka tools show (DescribeGroups, ListGroups).
    pub(crate) fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::PreparingRebalance => "PreparingRebalance",
            State::CompletingRebalance => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

/// What a JoinGroup carries.
#[derive(Clone, Debug)]
pub(crate) struct JoinArgs {
    /// The member id (empty on a first join).
    pub member_id: String,
    /// The static member id, echoed (static membership's no-rebalance restart is not
    /// offered: such a member is treated as a dynamic one).
    pub instance_id: Option<String>,
    /// The client's id (member ids start with it, as Kafka's do).
    pub client_id: String,
    /// Where the client connected from.
    pub client_host: String,
    /// How long without a heartbeat before the member is removed.
    pub session_timeout: Duration,
    /// How long a rebalance waits for this member to join again.
    pub rebalance_timeout: Duration,
    /// "consumer" for consumers.
    pub protocol_type: String,
    /// The assignors the member supports, best first, each with its subscription metadata.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4 and later: a first join gets MEMBER_ID_REQUIRED and an id to join with.
    pub require_known_member_id: bool,
}

/// The answer to a JoinGroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct JoinAnswer {
    /// Error code ([`code`]).
    pub error: i16,
    /// The generation the member is in.
    pub generation: i32,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The chosen assignor.
    pub protocol: Option<String>,
    /// The leader's member id.
    pub leader: String,
    /// The member's id.
    pub member_id: String,
    /// For the leader only: every member with its instance id and metadata for the chosen
    /// protocol.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

impl JoinAnswer {
    fn error(error: i16, member_id: &str) -> JoinAnswer {
        JoinAnswer {
            error,
            generation: -1,
            protocol_type: None,
            protocol: None,
            leader: String::new(),
            member_id: member_id.to_owned(),
            members: Vec::new(),
        }
    }
}

/// The answer to a SyncGroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SyncAnswer {
    /// Error code ([`code`]).
    pub error: i16,
    /// The member's assignment (empty with an error).
    pub assignment: Bytes,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The chosen assignor.
    pub protocol: Option<String>,
}

/// An answer now, or a channel that brings it when the round completes.
#[derive(Debug)]
pub(crate) enum Step<T> {
    /// Answered at once.
    Now(T),
    /// Answered when the round completes (a dropped sender: the group went away).
    Later(oneshot::Receiver<T>),
}

/// One member as DescribeGroups shows it.
#[derive(Clone, Debug)]
pub(crate) struct MemberView {
    /// Member id.
    pub member_id: String,
    /// Static instance id, if given.
    pub instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Metadata for the chosen protocol.
    pub metadata: Bytes,
    /// The assignment the leader gave it.
    pub assignment: Bytes,
}

#[derive(Debug)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    joining: Option<oneshot::Sender<JoinAnswer>>,
    syncing: Option<oneshot::Sender<SyncAnswer>>,
    last_heartbeat: Instant,
    /// Order of first join: the longest-standing member leads when the leader leaves.
    seq: u64,
}

impl Member {
    fn bytes(&self) -> usize {
        self.protocols
            .iter()
            .map(|(name, meta)| name.len() + meta.len())
            .sum::<usize>()
            + self.assignment.len()
    }

    /// Alive: it heartbeat within its session, or it waits in a JoinGroup or SyncGroup (a
    /// member blocked there cannot heartbeat).
    fn alive(&self, now: Instant) -> bool {
        self.joining.is_some()
            || self.syncing.is_some()
            || now.saturating_duration_since(self.last_heartbeat) <= self.session_timeout
    }
}

/// One group's membership (see the module doc).
#[derive(Debug)]
pub(crate) struct Group {
    state: State,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, until when they may join.
    pending: HashMap<String, Instant>,
    /// PreparingRebalance: when members that have not joined again are removed.
    deadline: Option<Instant>,
    /// PreparingRebalance of a group that was empty: not completed before this, so members
    /// starting together land in one generation.
    not_before: Option<Instant>,
    next_seq: u64,
    next_member: u64,
    initial_delay: Duration,
}

impl Group {
    /// An empty group; a rebalance out of the empty state waits `initial_delay` for more
    /// members.
    pub(crate) fn new(initial_delay: Duration) -> Group {
        Group {
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: HashMap::new(),
            deadline: None,
            not_before: None,
            next_seq: 0,
            next_member: 0,
            initial_delay,
        }
    }

    /// The state.
    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// The generation (0 before the first completed rebalance).
    #[cfg(test)]
    pub(crate) fn generation(&self) -> i32 {
        self.generation
    }

    /// The protocol type ("consumer"), once a member joined.
    pub(crate) fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    /// The chosen assignor, once a generation completed.
    pub(crate) fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    /// How many members joined.
    pub(crate) fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Whether the group has no member and no member id outstanding.
    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }

    /// The members, as DescribeGroups shows them.
    pub(crate) fn members(&self) -> Vec<MemberView> {
        self.members
            .iter()
            .map(|(id, m)| MemberView {
                member_id: id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: self
                    .protocol
                    .as_ref()
                    .and_then(|p| m.protocols.iter().find(|(name, _)| name == p))
                    .map(|(_, meta)| meta.clone())
                    .unwrap_or_default(),
                assignment: m.assignment.clone(),
            })
            .collect()
    }

    fn bytes(&self) -> usize {
        self.members.values().map(Member::bytes).sum()
    }

    /// Handles a JoinGroup.
    pub(crate) fn join(&mut self, args: JoinArgs, now: Instant) -> Step<JoinAnswer> {
        if args.session_timeout < MIN_SESSION_TIMEOUT || args.session_timeout > MAX_SESSION_TIMEOUT
        {
            return Step::Now(JoinAnswer::error(
                code::INVALID_SESSION_TIMEOUT,
                &args.member_id,
            ));
        }
        if args.protocol_type.is_empty() || args.protocols.is_empty() {
            return Step::Now(JoinAnswer::error(
                code::INCONSISTENT_GROUP_PROTOCOL,
                &args.member_id,
            ));
        }
        if !self.accepts_protocols(&args, &args.member_id) {
            return Step::Now(JoinAnswer::error(
                code::INCONSISTENT_GROUP_PROTOCOL,
                &args.member_id,
            ));
        }
        if args.member_id.is_empty() {
            if self.members.len() + self.pending.len() >= MAX_MEMBERS {
                return Step::Now(JoinAnswer::error(code::GROUP_MAX_SIZE_REACHED, ""));
            }
            let member_id = self.new_member_id(&args.client_id);
            if args.require_known_member_id {
                self.pending
                    .insert(member_id.clone(), now + args.session_timeout);
                return Step::Now(JoinAnswer::error(code::MEMBER_ID_REQUIRED, &member_id));
            }
            return self.add_member(member_id, args, now);
        }
        if self.pending.remove(&args.member_id).is_some() {
            let member_id = args.member_id.clone();
            return self.add_member(member_id, args, now);
        }
        let Some(member) = self.members.get(&args.member_id) else {
            return Step::Now(JoinAnswer::error(code::UNKNOWN_MEMBER_ID, &args.member_id));
        };
        let unchanged = member.protocols == args.protocols;
        let is_leader = self.leader.as_deref() == Some(args.member_id.as_str());
        match self.state {
            State::CompletingRebalance | State::Stable
                if unchanged && !(is_leader && self.state == State::Stable) =>
            {
                // Nothing new: the member lost the answer; give it the current generation.
                let member_id = args.member_id.clone();
                if let Some(member) = self.members.get_mut(&member_id) {
                    member.last_heartbeat = now;
                }
                Step::Now(self.join_answer(&member_id))
            }
            _ => {
                let member_id = args.member_id.clone();
                let (tx, rx) = oneshot::channel();
                if let Some(member) = self.members.get_mut(&member_id) {
                    member.protocols = args.protocols;
                    member.session_timeout = args.session_timeout;
                    member.rebalance_timeout = args.rebalance_timeout;
                    member.last_heartbeat = now;
                    member.joining = Some(tx);
                }
                if self.bytes() > MAX_GROUP_BYTES {
                    self.remove(&member_id);
                    return Step::Now(JoinAnswer::error(code::GROUP_MAX_SIZE_REACHED, &member_id));
                }
                if self.state != State::PreparingRebalance {
                    self.prepare_rebalance(now);
                }
                self.maybe_complete(now);
                Step::Later(rx)
            }
        }
    }

    /// Whether the member's protocol type and assignors fit the group's.
    fn accepts_protocols(&self, args: &JoinArgs, member_id: &str) -> bool {
        let others: Vec<&Member> = self
            .members
            .iter()
            .filter(|(id, _)| id.as_str() != member_id)
            .map(|(_, m)| m)
            .collect();
        if others.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(args.protocol_type.as_str()) {
            return false;
        }
        args.protocols.iter().any(|(name, _)| {
            others
                .iter()
                .all(|m| m.protocols.iter().any(|(theirs, _)| theirs == name))
        })
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_member += 1;
        let random: u64 = rand::random();
        format!("{client_id}-{random:016x}{:04x}", self.next_member & 0xffff)
    }

    fn add_member(&mut self, member_id: String, args: JoinArgs, now: Instant) -> Step<JoinAnswer> {
        let (tx, rx) = oneshot::channel();
        self.next_seq += 1;
        let member = Member {
            instance_id: args.instance_id,
            client_id: args.client_id,
            client_host: args.client_host,
            session_timeout: args.session_timeout,
            rebalance_timeout: args.rebalance_timeout,
            protocol_type: args.protocol_type,
            protocols: args.protocols,
            assignment: Bytes::new(),
            joining: Some(tx),
            syncing: None,
            last_heartbeat: now,
            seq: self.next_seq,
        };
        if self.bytes() + member.bytes() > MAX_GROUP_BYTES {
            return Step::Now(JoinAnswer::error(code::GROUP_MAX_SIZE_REACHED, &member_id));
        }
        if self.members.is_empty() {
            self.protocol_type = Some(member.protocol_type.clone());
        }
        self.members.insert(member_id, member);
        if self.state != State::PreparingRebalance {
            self.prepare_rebalance(now);
        }
        self.maybe_complete(now);
        Step::Later(rx)
    }

    /// Starts a rebalance: members waiting in SyncGroup are told to join again.
    fn prepare_rebalance(&mut self, now: Instant) {
        let was_empty = self.state == State::Empty;
        self.state = State::PreparingRebalance;
        let longest = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        self.deadline = Some(now + longest);
        self.not_before = was_empty.then(|| now + self.initial_delay.min(longest));
        for member in self.members.values_mut() {
            if let Some(waiting) = member.syncing.take() {
                let _ = waiting.send(SyncAnswer {
                    error: code::REBALANCE_IN_PROGRESS,
                    assignment: Bytes::new(),
                    protocol_type: None,
                    protocol: None,
                });
            }
        }
    }

    /// Completes the rebalance if every member joined again (and the initial delay passed),
    /// or if its deadline passed.
    fn maybe_complete(&mut self, now: Instant) {
        if self.state != State::PreparingRebalance {
            return;
        }
        let all_joined = self.members.values().all(|m| m.joining.is_some());
        let delayed = self.not_before.is_some_and(|t| now < t);
        let overdue = self.deadline.is_some_and(|t| now >= t);
        if !(overdue || (all_joined && !delayed)) {
            return;
        }
        let gone: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.joining.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.members.remove(&id);
        }
        self.deadline = None;
        self.not_before = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.become_empty();
            return;
        }
        self.protocol = self.choose_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self
                .members
                .iter()
                .min_by_key(|(_, m)| m.seq)
                .map(|(id, _)| id.clone());
        }
        self.state = State::CompletingRebalance;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let answer = self.join_answer(&id);
            if let Some(member) = self.members.get_mut(&id) {
                member.assignment = Bytes::new();
                member.last_heartbeat = now;
                if let Some(waiting) = member.joining.take() {
                    let _ = waiting.send(answer);
                }
            }
        }
    }

    fn become_empty(&mut self) {
        self.state = State::Empty;
        self.protocol = None;
        self.protocol_type = None;
        self.leader = None;
    }

    /// The assignor every member supports that most members put first (ties: the name).
    fn choose_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let common: Vec<&String> = first
            .protocols
            .iter()
            .map(|(name, _)| name)
            .filter(|name| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(theirs, _)| theirs == *name))
            })
            .collect();
        let mut votes: BTreeMap<&String, usize> = BTreeMap::new();
        for member in self.members.values() {
            if let Some((name, _)) = member
                .protocols
                .iter()
                .find(|(name, _)| common.contains(&name))
            {
                *votes.entry(name).or_default() += 1;
            }
        }
        votes
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
            .map(|(name, _)| name.clone())
    }

    /// The JoinGroup answer of `member_id` for the current generation.
    fn join_answer(&self, member_id: &str) -> JoinAnswer {
        let leader = self.leader.clone().unwrap_or_default();
        let members = if leader == member_id {
            self.members
                .iter()
                .map(|(id, m)| {
                    let metadata = self
                        .protocol
                        .as_ref()
                        .and_then(|p| m.protocols.iter().find(|(name, _)| name == p))
                        .map(|(_, meta)| meta.clone())
                        .unwrap_or_default();
                    (id.clone(), m.instance_id.clone(), metadata)
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinAnswer {
            error: code::NONE,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
            leader,
            member_id: member_id.to_owned(),
            members,
        }
    }

    /// Handles a SyncGroup: the leader's assignments complete the round.
    pub(crate) fn sync(
        &mut self,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> Step<SyncAnswer> {
        let error = |error| {
            Step::Now(SyncAnswer {
                error,
                assignment: Bytes::new(),
                protocol_type: None,
                protocol: None,
            })
        };
        if !self.members.contains_key(member_id) {
            return error(code::UNKNOWN_MEMBER_ID);
        }
        if generation != self.generation {
            return error(code::ILLEGAL_GENERATION);
        }
        match self.state {
            State::Empty => error(code::UNKNOWN_MEMBER_ID),
            State::PreparingRebalance => error(code::REBALANCE_IN_PROGRESS),
            State::Stable => Step::Now(self.sync_answer(member_id)),
            State::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                if let Some(member) = self.members.get_mut(member_id) {
                    member.syncing = Some(tx);
                    member.last_heartbeat = now;
                }
                if self.leader.as_deref() == Some(member_id) {
                    let given: usize = assignments.iter().map(|(_, a)| a.len()).sum();
                    if self.bytes() + given > MAX_GROUP_BYTES {
                        return error(code::GROUP_MAX_SIZE_REACHED);
                    }
                    for (id, assignment) in assignments {
                        if let Some(member) = self.members.get_mut(&id) {
                            member.assignment = assignment;
                        }
                    }
                    self.state = State::Stable;
                    let ids: Vec<String> = self.members.keys().cloned().collect();
                    for id in ids {
                        let answer = self.sync_answer(&id);
                        if let Some(member) = self.members.get_mut(&id) {
                            member.last_heartbeat = now;
                            if let Some(waiting) = member.syncing.take() {
                                let _ = waiting.send(answer);
                            }
                        }
                    }
                }
                Step::Later(rx)
            }
        }
    }

    fn sync_answer(&self, member_id: &str) -> SyncAnswer {
        SyncAnswer {
            error: code::NONE,
            assignment: self
                .members
                .get(member_id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
        }
    }

    /// Handles a Heartbeat.
    pub(crate) fn heartbeat(&mut self, member_id: &str, generation: i32, now: Instant) -> i16 {
        let Some(member) = self.members.get_mut(member_id) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        member.last_heartbeat = now;
        if generation != self.generation {
            return code::ILLEGAL_GENERATION;
        }
        match self.state {
            State::Empty => code::UNKNOWN_MEMBER_ID,
            State::PreparingRebalance => code::REBALANCE_IN_PROGRESS,
            State::CompletingRebalance | State::Stable => code::NONE,
        }
    }

    /// Handles a LeaveGroup of one member; the others rebalance.
    pub(crate) fn leave(&mut self, member_id: &str, now: Instant) -> i16 {
        if self.pending.remove(member_id).is_some() {
            return code::NONE;
        }
        if !self.members.contains_key(member_id) {
            return code::UNKNOWN_MEMBER_ID;
        }
        self.remove(member_id);
        self.after_removal(now);
        code::NONE
    }

    fn remove(&mut self, member_id: &str) {
        if let Some(member) = self.members.remove(member_id) {
            // A caller still waiting learns it is out.
            if let Some(waiting) = member.joining {
                let _ = waiting.send(JoinAnswer::error(code::UNKNOWN_MEMBER_ID, member_id));
            }
            if let Some(waiting) = member.syncing {
                let _ = waiting.send(SyncAnswer {
                    error: code::UNKNOWN_MEMBER_ID,
                    assignment: Bytes::new(),
                    protocol_type: None,
                    protocol: None,
                });
            }
        }
    }

    fn after_removal(&mut self, now: Instant) {
        match self.state {
            State::Stable | State::CompletingRebalance => {
                if self.members.is_empty() {
                    self.generation += 1;
                    self.become_empty();
                } else {
                    self.prepare_rebalance(now);
                }
            }
            State::PreparingRebalance => self.maybe_complete(now),
            State::Empty => {}
        }
    }

    /// Removes members whose session ran out and member ids never used, and completes a
    /// rebalance that is due. Called periodically.
    pub(crate) fn tick(&mut self, now: Instant) {
        self.pending.retain(|_, until| now <= *until);
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| !m.alive(now))
            .map(|(id, _)| id.clone())
            .collect();
        if !expired.is_empty() {
            tracing::info!(members = ?expired, "consumer group members' sessions expired");
            for id in &expired {
                self.remove(id);
            }
            self.after_removal(now);
        }
        self.maybe_complete(now);
    }

    /// Whether a commit by `member_id` at `generation` is taken: `Ok` or the error code.
    /// A commit without a member (generation -1, empty id: a consumer that assigns
    /// partitions itself) is taken while the group has no members.
    pub(crate) fn check_commit(&self, member_id: &str, generation: i32) -> Result<(), i16> {
        if generation < 0 && member_id.is_empty() {
            return match self.members.is_empty() {
                true => Ok(()),
                false => Err(code::UNKNOWN_MEMBER_ID),
            };
        }
        if !self.members.contains_key(member_id) {
            return Err(code::UNKNOWN_MEMBER_ID);
        }
        if generation != self.generation {
            return Err(code::ILLEGAL_GENERATION);
        }
        match self.state {
            State::CompletingRebalance => Err(code::REBALANCE_IN_PROGRESS),
            _ => Ok(()),
        }
    }

    /// Ends the group here (its coordinator moved or stops): every waiting member is told
    /// to find the coordinator again.
    pub(crate) fn unload(self) {
        for (id, member) in self.members {
            if let Some(waiting) = member.joining {
                let _ = waiting.send(JoinAnswer::error(code::NOT_COORDINATOR, &id));
            }
            if let Some(waiting) = member.syncing {
                let _ = waiting.send(SyncAnswer {
                    error: code::NOT_COORDINATOR,
                    assignment: Bytes::new(),
                    protocol_type: None,
                    protocol: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: Duration = Duration::from_secs(10);
    const REBALANCE: Duration = Duration::from_secs(30);

    fn args(member_id: &str, protocols: &[&str]) -> JoinArgs {
        JoinArgs {
            member_id: member_id.to_owned(),
            instance_id: None,
            client_id: "app".to_owned(),
            client_host: "/127.0.0.1".to_owned(),
            session_timeout: SESSION,
            rebalance_timeout: REBALANCE,
            protocol_type: "consumer".to_owned(),
            protocols: protocols
                .iter()
                .map(|p| ((*p).to_owned(), Bytes::from(format!("meta-{p}"))))
                .collect(),
            require_known_member_id: true,
        }
    }

    fn now_answer<T: std::fmt::Debug>(step: Step<T>) -> T {
        match step {
            Step::Now(answer) => answer,
            Step::Later(_) => panic!("expected an answer now"),
        }
    }

    fn later<T>(step: Step<T>) -> oneshot::Receiver<T> {
        match step {
            Step::Later(rx) => rx,
            Step::Now(_) => panic!("expected to wait"),
        }
    }

    /// Joins a new member (both steps); returns its id and the pending answer.
    fn join_new(g: &mut Group, now: Instant) -> (String, oneshot::Receiver<JoinAnswer>) {
        let first = now_answer(g.join(args("", &["range", "roundrobin"]), now));
        assert_eq!(first.error, code::MEMBER_ID_REQUIRED);
        let rx = later(g.join(args(&first.member_id, &["range", "roundrobin"]), now));
        (first.member_id, rx)
    }

    fn take<T: std::fmt::Debug>(rx: &mut oneshot::Receiver<T>) -> T {
        rx.try_recv().expect("answered")
    }

    /// Two members through a whole round to Stable; returns (leader, follower).
    fn two_member_group(g: &mut Group, t0: Instant) -> (String, String) {
        let (a, mut ra) = join_new(g, t0);
        let (b, mut rb) = join_new(g, t0);
        assert!(ra.try_recv().is_err(), "held for the initial delay");
        g.tick(t0 + Duration::from_secs(4));
        let (ja, jb) = (take(&mut ra), take(&mut rb));
        assert_eq!((ja.generation, jb.generation), (1, 1));
        assert_eq!(ja.leader, a);
        assert_eq!(ja.members.len(), 2, "the leader sees every member");
        assert!(jb.members.is_empty());
        assert_eq!(ja.protocol.as_deref(), Some("range"));
        let mut follower = later(g.sync(&b, 1, vec![], t0));
        let leader = now_answer_or_wait(g.sync(
            &a,
            1,
            vec![
                (a.clone(), Bytes::from_static(b"A")),
                (b.clone(), Bytes::from_static(b"B")),
            ],
            t0,
        ));
        assert_eq!(leader.assignment, Bytes::from_static(b"A"));
        assert_eq!(take(&mut follower).assignment, Bytes::from_static(b"B"));
        assert_eq!(g.state(), State::Stable);
        (a, b)
    }

    fn now_answer_or_wait(step: Step<SyncAnswer>) -> SyncAnswer {
        match step {
            Step::Now(answer) => answer,
            Step::Later(mut rx) => rx.try_recv().expect("answered"),
        }
    }

    #[test]
    fn two_members_join_one_generation_and_get_the_leaders_assignment() {
        let mut g = Group::new(Duration::from_secs(3));
        two_member_group(&mut g, Instant::now());
        assert_eq!(g.generation(), 1);
    }

    #[test]
    fn a_member_whose_heartbeats_stop_is_removed_and_the_other_rebalances() {
        let t0 = Instant::now();
        let mut g = Group::new(Duration::from_secs(3));
        let (a, b) = two_member_group(&mut g, t0);
        let t1 = t0 + SESSION / 2;
        assert_eq!(g.heartbeat(&b, 1, t1), code::NONE);
        let t2 = t0 + SESSION + Duration::from_secs(1);
        g.tick(t2);
        assert_eq!(g.member_count(), 1, "the silent leader is gone");
        assert_eq!(g.heartbeat(&b, 1, t2), code::REBALANCE_IN_PROGRESS);
        // The zombie's commit and heartbeat are refused.
        assert_eq!(g.check_commit(&a, 1), Err(code::UNKNOWN_MEMBER_ID));
        assert_eq!(g.heartbeat(&a, 1, t2), code::UNKNOWN_MEMBER_ID);
        let mut rb = later(g.join(args(&b, &["range", "roundrobin"]), t2));
        let answer = take(&mut rb);
        assert_eq!((answer.generation, answer.leader.as_str()), (2, b.as_str()));
        // An old generation's commit is refused once the new one is under way.
        assert_eq!(g.check_commit(&b, 1), Err(code::ILLEGAL_GENERATION));
        assert_eq!(g.check_commit(&b, 2), Err(code::REBALANCE_IN_PROGRESS));
        let sync =
            now_answer_or_wait(g.sync(&b, 2, vec![(b.clone(), Bytes::from_static(b"AB"))], t2));
        assert_eq!(sync.assignment, Bytes::from_static(b"AB"));
        assert_eq!(g.check_commit(&b, 2), Ok(()));
    }

    #[test]
    fn a_member_that_does_not_join_again_within_the_rebalance_timeout_is_removed() {
        let t0 = Instant::now();
        let mut g = Group::new(Duration::from_secs(3));
        let (a, b) = two_member_group(&mut g, t0);
        // A third member joins; `a` rejoins, `b` keeps heartbeating but never joins.
        let (_c, mut rc) = join_new(&mut g, t0);
        let mut ra = later(g.join(args(&a, &["range", "roundrobin"]), t0));
        for s in (5..30).step_by(5) {
            let t = t0 + Duration::from_secs(s);
            assert_eq!(g.heartbeat(&b, 1, t), code::REBALANCE_IN_PROGRESS);
            g.tick(t);
            assert!(
                ra.try_recv().is_err(),
                "answered at {s} s, before the deadline"
            );
        }
        g.tick(t0 + REBALANCE);
        assert_eq!(take(&mut ra).generation, 2);
        assert_eq!(take(&mut rc).generation, 2);
        assert_eq!(g.member_count(), 2);
        assert_eq!(g.check_commit(&b, 1), Err(code::UNKNOWN_MEMBER_ID));
    }

    #[test]
    fn leaving_rebalances_the_rest_and_the_last_leaving_empties_the_group() {
        let t0 = Instant::now();
        let mut g = Group::new(Duration::from_secs(3));
        let (a, b) = two_member_group(&mut g, t0);
        assert_eq!(g.leave(&a, t0), code::NONE);
        assert_eq!(g.state(), State::PreparingRebalance);
        let mut rb = later(g.join(args(&b, &["range"]), t0));
        let answer = take(&mut rb);
        assert_eq!(answer.leader, b);
        assert_eq!(g.leave(&b, t0), code::NONE);
        assert_eq!(g.state(), State::Empty);
        assert!(g.is_empty());
        // With no members, a consumer that assigns partitions itself may commit.
        assert_eq!(g.check_commit("", -1), Ok(()));
    }

    #[test]
    fn an_unused_member_id_expires_and_unknown_ids_are_refused() {
        let t0 = Instant::now();
        let mut g = Group::new(Duration::ZERO);
        let first = now_answer(g.join(args("", &["range"]), t0));
        assert_eq!(first.error, code::MEMBER_ID_REQUIRED);
        assert!(!g.is_empty());
        g.tick(t0 + SESSION + Duration::from_secs(1));
        assert!(g.is_empty());
        let late = now_answer(g.join(args(&first.member_id, &["range"]), t0));
        assert_eq!(late.error, code::UNKNOWN_MEMBER_ID);
    }

    #[test]
    fn a_member_without_a_common_assignor_or_with_a_bad_session_is_refused() {
        let t0 = Instant::now();
        let mut g = Group::new(Duration::from_secs(3));
        two_member_group(&mut g, t0);
        let other = now_answer(g.join(args("", &["cooperative-sticky"]), t0));
        assert_eq!(other.error, code::INCONSISTENT_GROUP_PROTOCOL);
        let mut bad = args("", &["range"]);
        bad.session_timeout = Duration::from_millis(10);
        assert_eq!(
            now_answer(g.join(bad, t0)).error,
            code::INVALID_SESSION_TIMEOUT
        );
    }

    #[test]
    fn a_group_holds_at_most_max_members() {
        let t0 = Instant::now();
        let mut g = Group::new(Duration::ZERO);
        for _ in 0..MAX_MEMBERS {
            assert_eq!(
                now_answer(g.join(args("", &["range"]), t0)).error,
                code::MEMBER_ID_REQUIRED
            );
        }
        assert_eq!(
            now_answer(g.join(args("", &["range"]), t0)).error,
            code::GROUP_MAX_SIZE_REACHED
        );
    }

    #[test]
    fn a_follower_joining_again_unchanged_gets_the_current_generation_at_once() {
        let t0 = Instant::now();
        let mut g = Group::new(Duration::from_secs(3));
        let (_a, b) = two_member_group(&mut g, t0);
        let again = now_answer(g.join(args(&b, &["range", "roundrobin"]), t0));
        assert_eq!((again.error, again.generation), (code::NONE, 1));
        assert_eq!(g.state(), State::Stable);
    }
}
