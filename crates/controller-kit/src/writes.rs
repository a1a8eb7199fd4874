//! Parameters of the writes that are not server-side applies (creates, merge patches),
//! named after their writer. Without a field manager the API server records `unknown` in
//! `managedFields`, and nobody can tell who wrote a field; a server-side apply names it
//! through `PatchParams::apply`.

use kube::api::{PatchParams, PostParams};

/// A merge (or JSON) patch written as `field_manager`.
pub fn patch_as(field_manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..PatchParams::default()
    }
}

/// A create written as `field_manager`.
pub fn create_as(field_manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(field_manager.to_owned()),
        ..PostParams::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_names_its_writer_and_nothing_else() {
        let patch = patch_as("vworkspace-backup-engine");
        assert_eq!(patch.field_manager.as_deref(), Some("vworkspace-backup-engine"));
        assert!(!patch.force && !patch.dry_run);
        let create = create_as("vworkspace-restore-engine");
        assert_eq!(create.field_manager.as_deref(), Some("vworkspace-restore-engine"));
        assert!(!create.dry_run);
    }
}
