//! Maintenance windows on the real cluster (ADR 0009): with a window opening two or three minutes
//! ahead, an Upgrade or Rollback waits (`Pending`, reason `QueuedForMaintenanceWindow`, the
//! message naming the window), an urgent one runs at once, one whose deadline comes first
//! ends `Expired`, and a chart version change from intent leaves the release as it is until
//! the window opens; then everything that waited runs, through real Flux releases.

use std::time::Duration;

use api::maintenance::{MaintenanceWindow, Weekday};
use api::{ApplicationInstance, OperationPhase};
use e2e::{
    TestContext,
    apps::{RELEASE_TIMEOUT, app, apply_app, condition, start_controller, wait_app, wait_deployed},
    ops::{OPERATION_TIMEOUT, create_operation, operation, start_engine, wait_phase},
};
use jiff::{SignedDuration, Timestamp, tz::TimeZone};
use serde_json::json;

/// A time zone with an offset that is not whole hours, so the test would notice a window
/// read in UTC.
const ZONE: &str = "Asia/Kolkata";

/// A window of ten minutes that opens at the first whole minute at least `lead` from now,
/// in [`ZONE`]. Returns it with its opening time.
fn window_opening_after(lead: SignedDuration) -> anyhow::Result<(MaintenanceWindow, Timestamp)> {
    let zone = TimeZone::get(ZONE)?;
    let earliest = Timestamp::now() + lead;
    let opens = earliest.round(
        jiff::TimestampRound::new()
            .smallest(jiff::Unit::Minute)
            .mode(jiff::RoundMode::Ceil),
    )?;
    let local = opens.to_zoned(zone);
    let day = Weekday::ALL[local.weekday().to_monday_zero_offset() as usize];
    let window = MaintenanceWindow {
        days: vec![day],
        start: local.strftime("%H:%M").to_string(),
        duration: "10m".into(),
        time_zone: Some(ZONE.into()),
    };
    Ok((window, opens))
}

fn message(op: &api::Operation) -> String {
    op.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Succeeded"))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

fn start_time(op: &api::Operation) -> Option<Timestamp> {
    op.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0)
}

#[tokio::test]
async fn changes_wait_for_the_maintenance_window_unless_urgent() -> anyhow::Result<()> {
    let ctx = TestContext::new("maint").await?;
    let _controller = start_controller(&ctx, &[]).await?;
    let _engine = start_engine(&ctx, "upgrade-engine", &[]).await?;

    // Installs are not changes: they go ahead whatever the windows.
    apply_app(&ctx, &app("shop", "demo-app", "0.1.0", json!({}))).await?;
    apply_app(&ctx, &app("wiki", "demo-app", "0.1.0", json!({}))).await?;
    wait_deployed(&ctx, "shop", "InstallSucceeded", "0.1.0").await?;
    wait_deployed(&ctx, "wiki", "InstallSucceeded", "0.1.0").await?;

    // Room for the urgent upgrade, the expiry (15 s) and the held change before the opening,
    // on a loaded CI machine too.
    let (window, opens) = window_opening_after(SignedDuration::from_secs(150))?;
    let described = window.describe();
    for name in ["shop", "wiki"] {
        let mut with_window = app(name, "demo-app", "0.1.0", json!({}));
        with_window.spec.maintenance_windows = vec![window.clone()];
        apply_app(&ctx, &with_window).await?;
    }

    // Urgent: runs now, a real version change outside the window, through the app controller.
    let mut hotfix = operation("hotfix", "shop", "Upgrade", json!({"chartVersion": "0.2.0"}));
    hotfix["spec"]["urgent"] = json!(true);
    create_operation(&ctx, &hotfix).await?;
    let hotfix = wait_phase(&ctx, "hotfix", OperationPhase::Succeeded, "Completed").await?;
    assert!(
        start_time(&hotfix).is_some_and(|t| t < opens),
        "the urgent upgrade started before the window opened at {opens}"
    );
    wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.2.0").await?;

    // Not urgent: waits, and says for which window.
    create_operation(
        &ctx,
        &operation("back", "shop", "Rollback", json!({"chartVersion": "0.1.0"})),
    )
    .await?;
    let waiting = wait_phase(&ctx, "back", OperationPhase::Pending, "QueuedForMaintenanceWindow").await?;
    let text = message(&waiting);
    assert!(
        text.contains(&described) && text.contains(&opens.to_string()),
        "the message names the window {described} and its opening {opens}: {text}"
    );

    // A deadline before the window: Expired, nothing done.
    let mut late = operation("late", "shop", "Upgrade", json!({"chartVersion": "0.2.0"}));
    late["spec"]["deadline"] = json!(
        (Timestamp::now() + SignedDuration::from_secs(15))
            .round(jiff::Unit::Second)?
            .to_string()
    );
    create_operation(&ctx, &late).await?;
    let late_waiting = wait_phase(&ctx, "late", OperationPhase::Pending, "QueuedForMaintenanceWindow").await?;
    assert!(
        message(&late_waiting).contains("after spec.deadline"),
        "{}",
        message(&late_waiting)
    );
    let expired = wait_phase(&ctx, "late", OperationPhase::Expired, "DeadlineExceeded").await?;
    assert_eq!(start_time(&expired), None, "an expired Operation never started");

    // Intent changes the chart version outside the window: held, the release untouched.
    let mut newer = app("wiki", "demo-app", "0.2.0", json!({}));
    newer.spec.maintenance_windows = vec![window.clone()];
    apply_app(&ctx, &newer).await?;
    let held = wait_app(
        &ctx,
        "wiki",
        "Reconciling=True WaitingForMaintenanceWindow",
        RELEASE_TIMEOUT,
        |a| condition(a, "Reconciling").is_some_and(|(s, r, _)| s == "True" && r == "WaitingForMaintenanceWindow"),
    )
    .await?;
    let (_, _, held_message) = condition(&held, "Reconciling").unwrap_or_default();
    assert!(
        held_message.contains("from 0.1.0 to 0.2.0") && held_message.contains(&described),
        "{held_message}"
    );
    assert_eq!(
        condition(&held, "Ready").map(|(s, r, _)| (s, r)),
        Some(("True".to_owned(), "InstallSucceeded".to_owned())),
        "Ready keeps describing the running release"
    );
    let release = e2e::get_json(&e2e::flux::helm_releases(&ctx), "wiki")
        .await?
        .unwrap_or_default();
    assert_eq!(release.pointer("/spec/chart/spec/version"), Some(&json!("0.1.0")));
    assert!(
        Timestamp::now() < opens,
        "the checks above ran before the window opened"
    );

    // The window opens: everything that waited goes ahead.
    let wait_for_window = Duration::try_from(opens.duration_since(Timestamp::now()))
        .unwrap_or_default()
        .saturating_add(OPERATION_TIMEOUT);
    let back = e2e::ops::wait_operation(
        &ctx,
        "back",
        "Succeeded after the window opened",
        wait_for_window,
        |op| op.status.as_ref().and_then(|s| s.phase) == Some(OperationPhase::Succeeded),
    )
    .await?;
    assert!(
        start_time(&back).is_some_and(|t| t >= opens),
        "the rollback started at {:?}, before the window opened at {opens}",
        start_time(&back)
    );
    wait_deployed(&ctx, "shop", "UpgradeSucceeded", "0.1.0").await?;
    let wiki = wait_deployed(&ctx, "wiki", "UpgradeSucceeded", "0.2.0").await?;
    assert_eq!(condition(&wiki, "Reconciling"), None, "nothing waits any more");
    let wiki: ApplicationInstance = ctx.api().get("wiki").await?;
    assert!(wiki.status.is_some());
    Ok(())
}
