//! Routing: which route a request takes.
//!
//! [`Routing`] is the extension point: implement it for custom logic, or use [`RouteTable`],
//! which evaluates configured routes in order (first match wins).

mod live;
mod matcher;
pub(crate) mod registry;
mod route;
mod table;

pub(crate) use self::live::LiveRoutes;
#[cfg(feature = "admin")]
pub(crate) use self::live::{RouteError, RouteSpec};
pub use self::matcher::Matcher;
pub use self::route::{Direct, Feature, Features, RequestHead, Route, Routing, Target};
pub use self::table::{RouteTable, Unbuilt};
