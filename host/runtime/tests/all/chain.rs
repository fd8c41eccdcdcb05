//! Call-time behaviour: hostile records fail the slab with a typed error naming the plugin,
//! the failed store is discarded, and the next slab routes on a rebuilt instance.
#![allow(clippy::unwrap_used, missing_docs)]

use crate::common::{PANIC_LINE, Poison, Slab, Spec, context, runtime};
use narad_runtime::{
    Chain, ChainError, ErrorCode, Failure, FailureKind, FuelBudget, Limits, Plugin, PluginError,
    Runtime, RuntimeConfig, UNDECIDED, Violation, run_trial,
};

const GOOD: &[Option<&[u8]>] = &[Some(b"a"), Some(b"b"), None, Some(b""), Some(b"c")];

/// A slab whose record at index 2 (offset 102) is poison.
fn poisoned() -> Slab {
    Slab::new(
        100,
        &[Some(b"a"), Some(b"b"), Some(b"X-poison"), Some(b"d")],
    )
}

fn chain_of(runtime: &Runtime, specs: &[Spec]) -> Chain {
    let plugins: Vec<Plugin> = specs
        .iter()
        .map(|s| Plugin::load(runtime, &s.wasm()).unwrap())
        .collect();
    Chain::new(plugins).unwrap()
}

/// Routes the poisoned slab (expecting an error), then a good slab (expecting success on a
/// rebuilt instance); returns the error.
fn fail_then_recover(runtime: &Runtime, poison: Poison) -> PluginError {
    let mut chain = chain_of(runtime, &[Spec::new("hostile").poison(poison)]);
    let good = Slab::new(0, GOOD);
    // A first good slab proves the instance works before the poison.
    chain.route(&context(2), &good.records()).unwrap();
    let err = chain.route(&context(2), &poisoned().records()).unwrap_err();
    assert_eq!(err.name, "hostile");
    assert_eq!(err.position, 0);
    let decisions = chain.route(&context(2), &good.records()).unwrap();
    assert_eq!(decisions, vec![1, 0, 1, 1, 1]);
    let stats = chain.stats();
    assert_eq!(stats[0].instantiations, 2, "the failed store is rebuilt");
    assert_eq!(stats[0].failures(err.kind()), 1);
    err
}

#[test]
fn a_chain_decides_every_record_below_the_partition_count() {
    let mut chain = chain_of(&runtime(), &[Spec::new("parity")]);
    let slab = Slab::new(0, GOOD);
    // 'a' = 97 -> 1, 'b' = 98 -> 0, keyless -> 1, empty -> 1, 'c' -> 1.
    assert_eq!(
        chain.route(&context(2), &slab.records()).unwrap(),
        vec![1, 0, 1, 1, 1]
    );
}

#[test]
fn an_empty_slab_routes_to_nothing() {
    let mut chain = chain_of(&runtime(), &[Spec::new("parity")]);
    let slab = Slab::new(0, &[]);
    assert_eq!(
        chain.route(&context(2), &slab.records()).unwrap(),
        Vec::<u32>::new()
    );
    assert_eq!(chain.stats()[0].calls, 0);
}

#[test]
fn an_endless_loop_runs_out_of_fuel_and_the_next_slab_routes() {
    let err = fail_then_recover(&runtime(), Poison::EndlessLoop);
    assert!(
        matches!(*err.failure, Failure::FuelExhausted { .. }),
        "{err:?}"
    );
}

#[test]
fn the_same_poison_slab_fails_the_same_way_on_replay() {
    let runtime = runtime();
    let mut chain = chain_of(&runtime, &[Spec::new("spin").poison(Poison::EndlessLoop)]);
    let first = chain.route(&context(2), &poisoned().records()).unwrap_err();
    let second = chain.route(&context(2), &poisoned().records()).unwrap_err();
    assert_eq!(first, second);
}

/// Runs an endless loop under a 30 ms deadline and `fuel`, expecting the deadline to stop it.
fn assert_deadline_stops_an_endless_loop(fuel: FuelBudget) {
    let limits = Limits {
        deadline: std::time::Duration::from_millis(30),
        fuel,
        ..Limits::default()
    };
    let runtime = Runtime::new(RuntimeConfig::default().limits(limits)).unwrap();
    let err = fail_then_recover(&runtime, Poison::EndlessLoop);
    assert!(
        matches!(*err.failure, Failure::Deadline { deadline_ms: 30 }),
        "{err:?}"
    );
}

#[test]
fn an_endless_loop_with_unbounded_fuel_is_stopped_by_the_deadline() {
    assert_deadline_stops_an_endless_loop(FuelBudget {
        base: u64::MAX / 2,
        ..FuelBudget::DEFAULT
    });
}

#[test]
fn a_budget_whose_terms_overflow_still_routes_and_is_still_stopped_by_the_deadline() {
    // An operator may set a huge per-record fuel term (`--plugin-fuel-per-record`): the budget
    // saturates, the engine accepts it, and the deadline remains the backstop.
    assert_deadline_stops_an_endless_loop(FuelBudget {
        per_record: u64::MAX,
        ..FuelBudget::DEFAULT
    });
}

#[test]
fn a_memory_grow_bomb_is_stopped_by_the_memory_limit() {
    let err = fail_then_recover(&runtime(), Poison::GrowBomb);
    assert!(
        matches!(*err.failure, Failure::MemoryLimit { .. }),
        "{err:?}"
    );
    assert_eq!(err.kind(), FailureKind::MemoryLimit);
}

#[test]
fn a_trap_is_reported_with_its_code() {
    let err = fail_then_recover(&runtime(), Poison::Trap);
    match *err.failure {
        Failure::Trap {
            code,
            message,
            guest_said,
        } => {
            assert_eq!(code.as_deref(), Some("UnreachableCodeReached"));
            assert_eq!(message, "wasm `unreachable` instruction executed");
            assert_eq!(guest_said, None);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_panic_is_reported_as_the_guest_said_it_in_one_line_without_a_backtrace() {
    let err = fail_then_recover(&runtime(), Poison::Panic);
    let Failure::Trap { guest_said, .. } = &*err.failure else {
        panic!("{err:?}");
    };
    assert_eq!(guest_said.as_deref(), Some(PANIC_LINE));
    let shown = err.to_string();
    assert!(
        shown.ends_with(&format!(
            "trapped: {} (wasm `unreachable` instruction executed)",
            PANIC_LINE
        )),
        "{shown}"
    );
    assert!(
        !shown.contains("wasm function") && !shown.contains("backtrace"),
        "{shown}"
    );
}

#[test]
fn an_out_of_range_answer_names_the_value_and_the_record() {
    let err = fail_then_recover(&runtime(), Poison::OutOfRange);
    assert_eq!(
        *err.failure,
        Failure::OutOfRange {
            value: 99,
            record_offset: 102,
            partition_count: 2
        }
    );
}

#[test]
fn a_length_returned_instead_of_a_status_is_a_protocol_violation() {
    let err = fail_then_recover(&runtime(), Poison::ReturnCount);
    assert_eq!(*err.failure, Failure::Protocol(Violation::ReturnCode(4)));
}

#[test]
fn an_error_return_carries_the_guest_message() {
    let err = fail_then_recover(&runtime(), Poison::ErrorReturn);
    assert_eq!(
        *err.failure,
        Failure::ErrorReturn {
            code: ErrorCode::Plugin,
            message: Some("no route for this record".into())
        }
    );
}

#[test]
fn records_left_undecided_at_the_end_of_the_chain_fail_naming_the_last_plugin() {
    let runtime = runtime();
    let mut chain = chain_of(
        &runtime,
        &[
            Spec::new("first").poison(Poison::Skip),
            Spec::new("second").poison(Poison::Skip),
        ],
    );
    let err = chain.route(&context(2), &poisoned().records()).unwrap_err();
    assert_eq!(err.position, 1);
    assert_eq!(err.name, "second");
    assert_eq!(*err.failure, Failure::Undecided { record_offset: 102 });
    assert_eq!(chain.stats()[1].failures(FailureKind::Undecided), 1);
}

#[test]
fn later_plugins_see_only_the_records_still_undecided() {
    let runtime = runtime();
    // The first plugin skips the poison record; the second decides everything it is given
    // but would trap on a poison record it is not handed... so it must be handed only that one.
    let mut chain = chain_of(
        &runtime,
        &[
            Spec::new("first").poison(Poison::Skip),
            Spec::new("catch-all"),
        ],
    );
    let decisions = chain.route(&context(2), &poisoned().records()).unwrap();
    // 'X' = 88 -> 0, decided by the second plugin.
    assert_eq!(decisions, vec![1, 0, 0, 0]);
    let stats = chain.stats();
    assert_eq!(stats[0].records_in, 4);
    assert_eq!(stats[0].records_decided, 3);
    assert_eq!(stats[1].records_in, 1);
    assert_eq!(stats[1].records_decided, 1);
}

#[test]
fn a_plugin_is_not_called_once_every_record_is_decided() {
    let runtime = runtime();
    let mut chain = chain_of(
        &runtime,
        &[
            Spec::new("parity"),
            Spec::new("never")
                .poison(Poison::Trap)
                .undecided_by_default(),
        ],
    );
    chain
        .route(&context(2), &Slab::new(0, GOOD).records())
        .unwrap();
    assert_eq!(chain.stats()[1].calls, 0);
}

#[test]
fn a_chain_holds_one_to_eight_plugins() {
    let runtime = runtime();
    let plugin = Plugin::load(&runtime, &Spec::new("parity").wasm()).unwrap();
    assert!(matches!(
        Chain::new(Vec::new()).unwrap_err(),
        ChainError::Length { len: 0, max: 8 }
    ));
    assert!(matches!(
        Chain::new(vec![plugin.clone(); 9]).unwrap_err(),
        ChainError::Length { len: 9, max: 8 }
    ));
    Chain::new(vec![plugin; 8]).unwrap();
}

#[test]
fn bisect_names_the_poison_record() {
    let runtime = runtime();
    let mut chain = chain_of(&runtime, &[Spec::new("trapper").poison(Poison::Trap)]);
    let mut keys: Vec<Option<&[u8]>> = vec![Some(b"ok"); 100];
    keys[37] = Some(b"X");
    keys[80] = Some(b"X");
    let slab = Slab::new(5000, &keys);
    let poison = chain.bisect(&context(4), &slab.records()).unwrap();
    assert_eq!(poison.index, 37);
    assert_eq!(poison.parent_offset, 5037);
    assert_eq!(poison.error.kind(), FailureKind::Trap);
    assert!(poison.alone, "the record fails on its own too");
}

#[test]
fn the_poison_search_counts_its_calls_apart_and_gives_each_its_own_attempt() {
    let runtime = runtime();
    let spec = Spec::new("picky").poison(Poison::ErrorNamingAttempt);
    let mut chain = chain_of(&runtime, &[spec]);
    let mut keys: Vec<Option<&[u8]>> = vec![Some(b"ok"); 100];
    keys[37] = Some(b"X");
    let slab = Slab::new(5000, &keys);
    let mut retry = context(4);
    retry.attempt = 1;
    let error = chain.route(&retry, &slab.records()).unwrap_err();
    let message = |e: &PluginError| match &*e.failure {
        Failure::ErrorReturn { message, .. } => message.clone().unwrap(),
        other => panic!("expected an error return, got {other:?}"),
    };
    assert!(message(&error).starts_with('B'), "{error}");

    let poison = chain.bisect(&retry, &slab.records()).unwrap();
    assert_eq!(poison.parent_offset, 5037);
    let routings = chain.last_search_routings();
    assert!(routings > 2, "{routings}");
    // The last routing of the search carried attempt 1 + routings: every one had its own.
    let last = char::from(b'A' + 1 + routings as u8);
    assert!(message(&poison.error).starts_with(last), "{}", poison.error);
    let stats = &chain.stats()[0];
    // One routing, one failure; the search's calls are counted apart, not as failures.
    assert_eq!(stats.calls, 1);
    assert_eq!(stats.search_calls, u64::from(routings));
    assert_eq!(stats.failures(FailureKind::ErrorReturn), 1);
}

#[test]
fn the_poison_search_stops_at_a_config_error_which_no_record_causes() {
    let runtime = runtime();
    let spec = Spec::new("unconfigured").poison(Poison::BadConfig).always();
    let mut chain = chain_of(&runtime, &[spec]);
    let slab = Slab::new(0, &[Some(&b"a"[..]); 64]);
    assert_eq!(chain.bisect(&context(4), &slab.records()), None);
    assert_eq!(chain.last_search_routings(), 1);
}

#[test]
fn bisect_finds_nothing_in_a_slab_that_routes() {
    let mut chain = chain_of(&runtime(), &[Spec::new("trapper").poison(Poison::Trap)]);
    assert_eq!(
        chain.bisect(&context(4), &Slab::new(0, GOOD).records()),
        None
    );
}

#[test]
fn a_log_flood_is_rate_limited_and_counted() {
    let runtime = runtime();
    let mut chain = chain_of(&runtime, &[Spec::new("chatty").poison(Poison::LogFlood)]);
    chain.route(&context(2), &poisoned().records()).unwrap();
    let stats = &chain.stats()[0];
    // 1,000 lines against a burst of 200: at least 700 are dropped whatever the timing.
    assert!(stats.log_lines_emitted >= 1, "{stats:?}");
    assert!(stats.log_lines_dropped >= 700, "{stats:?}");
    assert_eq!(stats.log_lines_emitted + stats.log_lines_dropped, 1000);
}

#[test]
fn a_large_slab_grows_the_guest_buffer_and_still_routes() {
    let mut chain = chain_of(&runtime(), &[Spec::new("parity")]);
    let keys: Vec<Vec<u8>> = (0..20_000u32).map(|i| i.to_le_bytes().repeat(8)).collect();
    let key_refs: Vec<Option<&[u8]>> = keys.iter().map(|k| Some(k.as_slice())).collect();
    // Small slab first (small buffer), then a large one (reallocated).
    chain
        .route(&context(2), &Slab::new(0, GOOD).records())
        .unwrap();
    let decisions = chain
        .route(&context(2), &Slab::new(0, &key_refs).records())
        .unwrap();
    for (i, d) in decisions.iter().enumerate() {
        assert_eq!(*d, u32::from(keys[i][0] & 1));
    }
    assert_eq!(chain.stats()[0].instantiations, 1);
}

#[test]
fn a_trial_run_reports_decisions_and_the_distribution() {
    let runtime = runtime();
    let mut chain = chain_of(&runtime, &[Spec::new("parity")]);
    let slab = Slab::new(0, GOOD);
    let report = run_trial(&mut chain, &context(3), &slab.records()).unwrap();
    assert_eq!(report.decisions, vec![1, 0, 1, 1, 1]);
    assert_eq!(report.distribution, vec![1, 4, 0]);
}

#[test]
fn a_failing_trial_names_the_poison_record() {
    let runtime = runtime();
    let mut chain = chain_of(&runtime, &[Spec::new("trapper").poison(Poison::Trap)]);
    let err = run_trial(&mut chain, &context(3), &poisoned().records()).unwrap_err();
    assert_eq!(err.error.kind(), FailureKind::Trap);
    let poison = err.poison.unwrap();
    assert_eq!((poison.index, poison.parent_offset), (2, 102));
}

#[test]
fn undecided_is_never_a_valid_partition() {
    // A chain whose only plugin decides nothing fails on the first record.
    let mut chain = chain_of(&runtime(), &[Spec::new("idle").undecided_by_default()]);
    let err = chain
        .route(&context(2), &Slab::new(7, GOOD).records())
        .unwrap_err();
    assert_eq!(*err.failure, Failure::Undecided { record_offset: 7 });
    assert_eq!(UNDECIDED, u32::MAX);
}

#[test]
fn chains_sharing_one_runtime_and_plugin_route_on_parallel_threads() {
    let runtime = runtime();
    let plugin = Plugin::load(&runtime, &Spec::new("parity").wasm()).unwrap();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let plugin = plugin.clone();
                scope.spawn(move || {
                    let mut chain = Chain::new([plugin]).unwrap();
                    let slab = Slab::new(0, GOOD);
                    (0..50)
                        .map(|_| chain.route(&context(2), &slab.records()).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            for decisions in handle.join().unwrap() {
                assert_eq!(decisions, vec![1, 0, 1, 1, 1]);
            }
        }
    });
}
