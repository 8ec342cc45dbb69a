// PLACEHOLDER so the workspace compiles while the real client is written; replace wholesale.
pub struct Link;
#[derive(Clone)]
pub struct Display;
pub fn connect_from_env() -> std::io::Result<Option<&'static Link>> {
    Ok(None)
}
pub fn link() -> Option<&'static Link> {
    None
}
