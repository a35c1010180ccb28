//! [`Fields`]: a request's header fields as every transport holds them — hyper's
//! [`HeaderMap`], or the HTTP/1 fast path's offsets into the bytes the client sent — so that a
//! rule reads them once, for every transport.

use http::{HeaderMap, HeaderValue};

/// A request's header fields, read by name.
pub trait Fields {
    /// The values of the fields named `name` (lowercase), in the order they came.
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a;

    /// The value of the first field named `name` (lowercase).
    fn first<'a>(&'a self, name: &'a str) -> Option<&'a [u8]> {
        self.named(name).next()
    }
}

/// [`Fields`] as a trait object, for what reads a request's fields behind `dyn` (a
/// [`RouteFeature`](crate::route_feature::RouteFeature)'s hooks). Every [`Fields`] is one, and
/// `dyn DynFields` is a [`Fields`] again.
pub trait DynFields: Sync {
    /// [`Fields::first`].
    fn first_value<'a>(&'a self, name: &'a str) -> Option<&'a [u8]>;

    /// [`Fields::named`], boxed.
    fn each_value<'a>(&'a self, name: &'a str) -> Box<dyn Iterator<Item = &'a [u8]> + 'a>;
}

impl<T: Fields + Sync> DynFields for T {
    fn first_value<'a>(&'a self, name: &'a str) -> Option<&'a [u8]> {
        self.first(name)
    }

    fn each_value<'a>(&'a self, name: &'a str) -> Box<dyn Iterator<Item = &'a [u8]> + 'a> {
        Box::new(self.named(name))
    }
}

impl Fields for dyn DynFields + '_ {
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.each_value(name)
    }

    fn first<'a>(&'a self, name: &'a str) -> Option<&'a [u8]> {
        self.first_value(name)
    }
}

impl Fields for HeaderMap {
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.get_all(name).iter().map(HeaderValue::as_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_map_gives_every_value_in_order_and_the_first() {
        let mut map = HeaderMap::new();
        map.append("x-a", HeaderValue::from_static("1"));
        map.append("x-a", HeaderValue::from_static("2"));
        let values: Vec<&[u8]> = map.named("x-a").collect();
        assert_eq!(values, [&b"1"[..], b"2"]);
        assert_eq!(map.first("x-a"), Some(&b"1"[..]));
        assert_eq!(map.first("x-b"), None);
    }

    #[test]
    fn behind_dyn_the_fields_read_the_same() {
        let mut map = HeaderMap::new();
        map.append("x-a", HeaderValue::from_static("1"));
        map.append("x-a", HeaderValue::from_static("2"));
        let fields: &dyn DynFields = &map;
        assert_eq!(fields.named("x-a").collect::<Vec<_>>(), [&b"1"[..], b"2"]);
        assert_eq!(fields.first("x-a"), Some(&b"1"[..]));
        assert_eq!(fields.first("x-b"), None);
    }
}
