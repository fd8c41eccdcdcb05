#[test]
fn a_remote_child_is_failed_only_while_stalled_on_a_refusal_and_resumes_where_its_file_says() {
    let status = CursorStatus::new(
        CursorLabels {
            parent: "orders".into(),
            child: "to-b".into(),
            partition: 0,
        },
        Arc::new(FanoutMetrics::default()),
    );
    status.set_position(40, 90);
    let state = |status: &CursorStatus| {
        let mut report = status.report();
        report.mark_remote();
        (report.remote_state, report.recovery_point)
    };
    assert_eq!(state(&status), (Some(RemoteState::Running), Some(40)));
    status.stalled("retrying: no answer".into());
    assert_eq!(state(&status).0, Some(RemoteState::Retrying));
    status.stalled_refused("failed: 404".into());
    assert_eq!(state(&status).0, Some(RemoteState::Failed));
    // Healthy again: the refusal is over.
    status.running();
    assert_eq!(state(&status).0, Some(RemoteState::Running));
    status.stalled("retrying: 503".into());
    assert_eq!(state(&status).0, Some(RemoteState::Retrying));
}
use super::*;

fn status() -> CursorStatus {
    CursorStatus::new(
        CursorLabels {
            parent: "orders".into(),
            child: "copy".into(),
            partition: 0,
        },
        Arc::new(FanoutMetrics::default()),
    )
}

#[test]
fn a_cursor_waiting_in_a_commit_has_its_lag_and_due_lag_kept_rising_until_it_moves() {
    let status = status();
    status.set_position(40, 40);
    // A delay-10 s slab whose oldest record was committed at t = 100 s, read at t = 115 s.
    status.committing(Some(100_000), 10_000, 115_000);
    assert_eq!(status.report().due_lag_seconds, 5.0);
    // The commit waits while the parent grows and time passes.
    status.refresh(Some(90), 145_000, crate::fanout::NO_PROGRESS_AFTER);
    let report = status.report();
    assert_eq!(report.lag_messages, Some(50));
    assert_eq!(report.due_lag_seconds, 35.0);
    // Once it moves, the cursor's own figures win again.
    status.set_position(60, 90);
    status.refresh(Some(95), 160_000, crate::fanout::NO_PROGRESS_AFTER);
    let report = status.report();
    assert_eq!(report.lag_messages, Some(35));
    assert_eq!(
        report.due_lag_seconds, 35.0,
        "no slab waits now: the due lag is not re-aged"
    );
}

#[test]
fn a_running_cursor_with_work_that_does_not_move_is_reported_stalled_and_an_idle_one_is_not() {
    let bound = std::time::Duration::from_millis(20);
    let idle = status();
    idle.set_position(40, 40);
    let paused = status();
    paused.set_position(10, 40);
    paused.paused();
    let stuck = status();
    stuck.set_position(10, 40);
    stuck.refresh(Some(40), 0, bound);
    assert_eq!(stuck.report().state, CursorState::Running, "not yet");
    std::thread::sleep(bound * 2);
    for s in [&idle, &paused, &stuck] {
        s.refresh(Some(40), 0, bound);
    }
    assert_eq!(idle.report().state, CursorState::Running, "nothing to copy");
    assert_eq!(paused.report().state, CursorState::Paused);
    let report = stuck.report();
    assert_eq!(report.state, CursorState::Stalled);
    assert!(
        report
            .last_error
            .is_some_and(|e| e.starts_with("no progress for")),
    );
    // Moving again clears it, as any stall.
    stuck.set_position(20, 40);
    stuck.running();
    assert_eq!(stuck.report().last_error, None);
}

#[test]
fn a_cursor_healthy_again_shows_no_current_error_and_keeps_it_as_previous() {
    let status = status();
    status.stalled("routing failed: plugin trapped".into());
    let stalled = status.report();
    assert_eq!(stalled.state, CursorState::Stalled);
    assert_eq!(
        stalled.last_error.as_deref(),
        Some("routing failed: plugin trapped")
    );
    assert!(stalled.last_error_at_ms.is_some());

    status.slab_committed(10);
    status.running();
    let recovered = status.report();
    assert_eq!(recovered.state, CursorState::Running);
    assert_eq!(recovered.last_error, None);
    assert_eq!(recovered.last_error_at_ms, None);
    assert_eq!(
        recovered.previous_error.as_deref(),
        Some("routing failed: plugin trapped")
    );
    assert_eq!(recovered.previous_error_at_ms, stalled.last_error_at_ms);

    // Idle reads while healthy keep the history as it is.
    status.running();
    assert_eq!(status.report().previous_error, recovered.previous_error);
}

#[test]
fn an_error_is_stored_escaped_and_cut_to_the_cap() {
    let status = status();
    status.stalled(format!("a\nforged\0{}", "E".repeat(8 * 1024)));
    let shown = status.report().last_error.unwrap_or_default();
    assert!(shown.starts_with("a\\nforged\\0E"), "{shown:?}");
    assert!(!shown.chars().any(char::is_control));
    assert!(
        shown.len() <= MAX_ERROR_TEXT_BYTES + narad_runtime::text::CUT_MARKER_MAX_BYTES,
        "{} bytes",
        shown.len()
    );
}

#[test]
fn a_rewind_to_the_parents_end_is_counted_in_the_report() {
    let status = status();
    status.rewound_to_parent_end();
    assert_eq!(status.report().parent_end_rewinds, 1);
}

/// The text `/metrics` serves for `metrics`, one line per series.
fn scraped(metrics: &FanoutMetrics) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    text
}

#[test]
fn a_cursors_lag_and_progress_reach_metrics_and_a_successor_of_the_same_labels_owns_them() {
    let metrics = Arc::new(FanoutMetrics::default());
    let labels = CursorLabels {
        parent: "orders".into(),
        child: "copy".into(),
        partition: 3,
    };
    let lag = r#"narad_fanout_lag_messages{parent="orders",child="copy",partition="3"}"#;
    let first = CursorStatus::new(labels.clone(), Arc::clone(&metrics));
    first.set_position(10, 17);
    assert!(
        scraped(&metrics).contains(&format!("{lag} 7\n")),
        "{}",
        scraped(&metrics)
    );
    first.refresh(Some(30), 0, crate::fanout::NO_PROGRESS_AFTER);
    assert!(scraped(&metrics).contains(&format!("{lag} 20\n")));
    // Stopped: its series go. The next cursor of the link's partition has its own.
    first.retire();
    assert!(!scraped(&metrics).contains(lag));
    let next = CursorStatus::new(labels, Arc::clone(&metrics));
    next.set_position(30, 31);
    next.set_due_lag(2.5);
    let text = scraped(&metrics);
    assert!(text.contains(&format!("{lag} 1\n")), "{text}");
    assert!(
        text.contains(
            r#"narad_fanout_due_lag_seconds{parent="orders",child="copy",partition="3"} 2.5"#
        ),
        "{text}"
    );
}
