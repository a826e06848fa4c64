//! Agent router (issue 5).
