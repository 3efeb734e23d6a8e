//! `hami-certgen`: makes the webhook's serving certificate and patches its caBundle.

fn main() {}
