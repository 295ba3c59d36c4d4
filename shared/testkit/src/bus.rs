//! Clean-up of the broker after a test or benchmark.

/// Removes the exchanges and queues of topology `prefix` from the broker (a benchmark run's
/// own, so that nothing of it stays behind); what is already gone is skipped.
pub async fn drop_topology(amqp_url: &str, prefix: &str) -> anyhow::Result<()> {
    let connection = lapin::Connection::connect(amqp_url, Default::default()).await?;
    let channel = connection.create_channel().await?;
    let topology = engram_bus::Topology::new(prefix);
    let mut queues = vec![topology.dead_letter_queue()];
    for spec in engram_bus::queues::all(std::time::Duration::from_secs(1)) {
        queues.push(topology.queue(spec.name));
        queues.push(topology.delay_queue(spec.name));
    }
    for queue in queues {
        let _ = channel.queue_delete(queue.into(), Default::default()).await;
    }
    for exchange in [
        topology.events_exchange(),
        topology.retry_exchange(),
        topology.dead_letter_exchange(),
    ] {
        let _ = channel
            .exchange_delete(exchange.into(), Default::default())
            .await;
    }
    let _ = connection.close(200, "bye".into()).await;
    Ok(())
}
