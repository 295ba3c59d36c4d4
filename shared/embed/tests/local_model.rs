//! The local model is really all-MiniLM-L6-v2: it reproduces the similarities sentence-transformers
//! publishes, ranks related pairs above unrelated ones, and batching does not change embeddings.

use engram_embed::{Embedder, LocalEmbedder, LocalModelSettings, cosine};

fn embedder() -> LocalEmbedder {
    embedder_with_batch(32)
}

fn embedder_with_batch(max_batch: usize) -> LocalEmbedder {
    LocalEmbedder::load(&LocalModelSettings {
        model_dir: engram_embed::installed_model_dir(),
        max_batch,
        max_tokens: 256,
        inference_nice: 0,
        yield_to_requests: None,
    })
    .expect("the model is installed (make test runs deploy/local/models.sh)")
}

fn texts(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn reproduces_the_published_reference_similarities() {
    let embedder = embedder();
    assert_eq!(embedder.dimension(), 384);
    let vectors = embedder
        .embed(&texts(&[
            "The weather is lovely today.",
            "It's so sunny outside!",
            "He drove to the stadium.",
        ]))
        .await
        .unwrap();
    for vector in &vectors {
        let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "unit length, got {norm}");
    }
    let pairs = [((0, 1), 0.6660), ((0, 2), 0.1046), ((1, 2), 0.1411)];
    for ((a, b), published) in pairs {
        let ours = cosine(&vectors[a], &vectors[b]);
        assert!(
            (ours - published).abs() < 0.002,
            "pair {a}-{b}: {ours:.4} vs published {published:.4}"
        );
    }
}

#[tokio::test]
async fn related_pairs_score_above_unrelated_ones() {
    // (anchor, related, unrelated)
    let triples = [
        (
            "I prefer dark mode in my editor",
            "Please use a dark theme for the IDE",
            "The train to Lisbon leaves at noon",
        ),
        (
            "My flight to Tokyo is on Friday",
            "I'm flying to Japan at the end of the week",
            "She prefers oat milk in her coffee",
        ),
        (
            "I'm allergic to peanuts",
            "Nuts give me a severe allergic reaction",
            "The quarterly report is due Monday",
        ),
        (
            "The team standup is every day at 9:30",
            "We have a daily morning sync meeting",
            "My cat sleeps on the sofa",
        ),
        (
            "I am learning Rust for my new job",
            "Studying the Rust programming language for work",
            "It rained all weekend in Berlin",
        ),
        (
            "My sister lives in Madrid",
            "My sibling's home is in Spain's capital",
            "Reset the router if the wifi drops",
        ),
        (
            "Remind me to renew my passport",
            "My passport expires soon and needs renewal",
            "The soup needs more salt",
        ),
        (
            "We decided to ship the release on Monday",
            "The launch is scheduled for the start of the week",
            "Penguins live in the southern hemisphere",
        ),
        (
            "I run five kilometres every morning",
            "Jogging is part of my daily routine",
            "The invoice was paid by bank transfer",
        ),
        (
            "The database migration failed last night",
            "Last night's schema upgrade broke",
            "I like listening to jazz",
        ),
        (
            "My favourite food is sushi",
            "I love eating Japanese raw fish dishes",
            "The printer on floor two is jammed",
        ),
        (
            "Our budget for the project is 50,000 euros",
            "The project has fifty thousand euros of funding",
            "My dog is afraid of thunder",
        ),
        (
            "I need to call my dentist tomorrow",
            "Tomorrow I must phone the dental clinic",
            "The museum opens at ten",
        ),
        (
            "The office moved to a new building",
            "We relocated our workplace to different premises",
            "Tomatoes grow well in summer",
        ),
        (
            "I'm vegetarian and don't eat meat",
            "I follow a plant-based diet without meat",
            "The laptop battery lasts six hours",
        ),
        (
            "Alice is the new engineering manager",
            "The engineering team now reports to Alice",
            "The river flooded the valley",
        ),
        (
            "I'm afraid of flying",
            "Airplanes make me very anxious",
            "Our API uses JSON over HTTP",
        ),
        (
            "The meeting was moved to Thursday",
            "We rescheduled the meeting for Thursday",
            "He bought a new bicycle",
        ),
        (
            "I want to run a marathon next year",
            "My goal is to complete 42 km in a race next year",
            "The cake needs two eggs",
        ),
        (
            "Send invoices to billing@example.com",
            "Billing documents go to the billing email address",
            "Mount Everest is very tall",
        ),
        (
            "My son plays the violin",
            "My child is learning to play the violin",
            "The server has 64 GB of memory",
        ),
        (
            "I hate waking up early",
            "Early mornings are the worst for me",
            "The bridge was built in 1890",
        ),
    ];
    let embedder = embedder();
    let mut flat = Vec::new();
    for (anchor, related, unrelated) in triples {
        flat.extend([anchor, related, unrelated].map(str::to_owned));
    }
    let vectors = embedder.embed(&flat).await.unwrap();
    for (index, (anchor, related, unrelated)) in triples.iter().enumerate() {
        let [a, r, u] = [
            &vectors[3 * index],
            &vectors[3 * index + 1],
            &vectors[3 * index + 2],
        ];
        let (near, far) = (cosine(a, r), cosine(a, u));
        assert!(
            near > far,
            "{anchor:?}: related {related:?} {near:.3} <= unrelated {unrelated:?} {far:.3}"
        );
    }
}

#[tokio::test]
async fn a_batch_embeds_like_one_text_at_a_time() {
    let embedder = embedder();
    let inputs = texts(&[
        "short",
        "A considerably longer sentence, so that the others in the batch are padded to its length.",
        "我喜欢喝绿茶",
        "Remind me to renew my passport before the trip to Lisbon next month, please.",
    ]);
    let batched = embedder.embed(&inputs).await.unwrap();
    for (text, batched) in inputs.iter().zip(&batched) {
        let alone = embedder
            .embed(std::slice::from_ref(text))
            .await
            .unwrap()
            .remove(0);
        let difference = alone
            .iter()
            .zip(batched)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(difference < 1e-5, "{text:?}: max difference {difference}");
    }
}

#[tokio::test]
async fn batches_of_like_length_return_vectors_in_the_order_of_the_texts() {
    // Batches of two: the texts are embedded longest first, in three batches, and must come back
    // in the order they were given.
    let small_batches = embedder_with_batch(2);
    let inputs = texts(&[
        "ok",
        "My sister lives in Madrid and visits every summer with her two children.",
        "I'm allergic to peanuts",
        "The quarterly report is due Monday, and the finance team wants the draft by Friday noon.",
        "thanks!",
    ]);
    let together = small_batches.embed(&inputs).await.unwrap();
    assert_eq!(together.len(), inputs.len());
    for (text, vector) in inputs.iter().zip(&together) {
        let alone = small_batches
            .embed(std::slice::from_ref(text))
            .await
            .unwrap()
            .remove(0);
        let similarity = cosine(&alone, vector);
        assert!(
            similarity > 0.9999,
            "{text:?}: cosine {similarity} to itself alone"
        );
    }
}
