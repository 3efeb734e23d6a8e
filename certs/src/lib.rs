//! Certificate generation for the hami-limits admission webhook.
