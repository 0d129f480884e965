//! Placeholder: filled in by the pre-trained models work (issue #12).
