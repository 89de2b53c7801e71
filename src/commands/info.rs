//! `sluice info`: the data dir's device, backend and free space.

use super::open_store;
use crate::cli::{Cli, DocFormat};
use crate::size::human;

pub fn run(cli: &Cli, format: DocFormat) -> anyhow::Result<()> {
    let store = open_store(cli)?;
    let device = store.device().describe();
    let space = store.space();
    let doc = serde_json::json!({
        "data_dir": store.data_dir(),
        "device": device,
        "space": space,
        "free_bytes": space.free_chunks * space.chunk_size,
        "orphaned_metadata": store.orphans(),
    });
    match format {
        DocFormat::Json => println!("{}", serde_json::to_string_pretty(&doc)?),
        DocFormat::Table => {
            println!("data dir     {}", store.data_dir().display());
            println!(
                "device       {} ({} backend, fixed buffers: {})",
                device.path.display(),
                device.backend,
                device.fixed_buffers
            );
            println!("capacity     {}", human(device.capacity));
            println!(
                "chunks       {} of {} free ({} each)",
                space.free_chunks,
                space.total_chunks,
                human(space.chunk_size)
            );
            let orphans = store.orphans().metadata_files.len();
            if orphans > 0 {
                println!("orphans      {orphans} metadata files named by no version (`sluice gc`)");
            }
        }
    }
    Ok(())
}
