//! Vision: ImageFolder datasets, torchvision-style transforms and a background input pipeline.

pub mod folder;
pub mod loader;
pub mod resident;
pub mod transforms;
