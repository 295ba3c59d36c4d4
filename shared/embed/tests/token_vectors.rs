//! Static token vectors distilled from the local model: a lone word's vector points where the
//! model's own embedding of it does, texts on one topic stay closer than texts on different ones, punctuation
//! and stop words do not decide a topic, and each token goes through the model once.

use engram_embed::{Embedder, LocalEmbedder, LocalModelSettings, TokenVectorEmbedder, cosine};

fn model() -> LocalEmbedder {
    LocalEmbedder::load(&LocalModelSettings {
        model_dir: engram_embed::installed_model_dir(),
        max_batch: 32,
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
async fn a_lone_word_points_where_the_models_embedding_of_it_does() {
    let model = model();
    let tokens = TokenVectorEmbedder::new(model.clone());
    let words = texts(&["garden", "passport", "salary"]);
    let distilled = tokens.embed(&words).await.unwrap();
    let sentence = model.embed(&words).await.unwrap();
    for (i, vector) in distilled.iter().enumerate() {
        assert_eq!(vector.len(), 384);
        let own = cosine(vector, &sentence[i]);
        for (j, other) in sentence.iter().enumerate().filter(|(j, _)| *j != i) {
            assert!(
                own > cosine(vector, other) + 0.2,
                "{} vs {}",
                words[i],
                words[j]
            );
        }
    }
}

#[tokio::test]
async fn texts_on_one_topic_stay_closer_than_texts_on_different_ones() {
    let tokens = TokenVectorEmbedder::new(model());
    let vectors = tokens
        .embed(&texts(&[
            "I need to renew my passport before the flight to Lisbon",
            "Which documents do I need at the airport for an international trip?",
            "The tomatoes in my garden are finally ripe",
            "我的护照下个月过期",
            "护照和签证",
        ]))
        .await
        .unwrap();
    let travel = cosine(&vectors[0], &vectors[1]);
    let across = cosine(&vectors[0], &vectors[2]).max(cosine(&vectors[1], &vectors[2]));
    assert!(travel > across + 0.1, "travel {travel}, across {across}");
    // The model is English-only: a Chinese character is a token of its own and most are
    // unknown to it, so Chinese turns are compared by the few characters it has.
    let chinese = cosine(&vectors[3], &vectors[4]);
    let chinese_across = cosine(&vectors[3], &vectors[2]);
    assert!(chinese > chinese_across, "{chinese} vs {chinese_across}");
}

#[tokio::test]
async fn punctuation_and_stop_words_do_not_decide_a_topic() {
    let tokens = TokenVectorEmbedder::new(model());
    let vectors = tokens
        .embed(&texts(&[
            "the garden",
            "garden",
            "!!! ... ???",
            "the of and to in",
            "GARDEN!",
        ]))
        .await
        .unwrap();
    assert!(cosine(&vectors[0], &vectors[1]) > 0.95);
    assert!(
        cosine(&vectors[4], &vectors[1]) > 0.9999,
        "case and punctuation are not words"
    );
    assert!(
        vectors[2].iter().all(|&x| x == 0.0),
        "punctuation alone has no topic"
    );
    let norm: f32 = vectors[3].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(
        (norm - 1.0).abs() < 1e-5,
        "stop words alone still make a unit vector"
    );
}

#[tokio::test]
async fn each_token_goes_through_the_model_once() {
    let tokens = TokenVectorEmbedder::new(model());
    assert_eq!(tokens.cached_tokens(), 0);
    let first = tokens
        .embed(&texts(&["a trip to Lisbon in June", "Lisbon in June"]))
        .await
        .unwrap();
    let cached = tokens.cached_tokens();
    assert!(cached >= 4, "{cached}");
    let again = tokens.embed(&texts(&["June in Lisbon"])).await.unwrap();
    assert_eq!(
        tokens.cached_tokens(),
        cached,
        "no new token, no model call"
    );
    assert!(
        cosine(&first[1], &again[0]) > 0.9999,
        "word order does not matter"
    );
}

#[tokio::test]
async fn a_text_of_known_tokens_needs_no_model_pass_and_waits_for_none() {
    let model = model();
    let tokens = TokenVectorEmbedder::new(model.clone());
    let known = texts(&["a trip to Lisbon in June"]);
    let first = tokens.embed(&known).await.unwrap();
    assert!(
        tokens
            .embed_if_known(&texts(&["an unheard-of zeppelin"]))
            .unwrap()
            .is_none(),
        "new tokens need the model"
    );
    let without_model = tokens
        .embed_if_known(&texts(&["June in Lisbon: a trip to"]))
        .unwrap()
        .expect("every token was met before");
    assert!(cosine(&first[0], &without_model[0]) > 0.9999);

    // Texts of tokens never met keep every model thread busy computing their vectors, with
    // more queued behind; the known text's vector does not queue behind them (a query's turn
    // vector waited there for other queries' new words, milliseconds on the path of a
    // retrieval): it is ready before the first of them is done.
    let words: Vec<String> = {
        let model = model.clone();
        tokio::task::spawn_blocking(move || vocabulary_words(&model))
            .await
            .unwrap()
    };
    let (done, mut order) = tokio::sync::mpsc::unbounded_channel();
    let busy: Vec<_> = words
        .chunks(words.len() / 6)
        .map(|chunk| {
            let text = vec![chunk.join(" ")];
            let done = done.clone();
            let tokens = tokens.clone();
            tokio::spawn(async move {
                tokens.embed(&text).await.unwrap();
                let _ = done.send("new tokens");
            })
        })
        .collect();
    // Let them reach the model threads first.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    tokens.embed(&known).await.unwrap();
    let _ = done.send("known text");
    for job in busy {
        job.await.unwrap();
    }
    assert_eq!(order.recv().await, Some("known text"));
}

/// Six thousand whole words of the model's vocabulary (each a token of its own).
fn vocabulary_words(model: &LocalEmbedder) -> Vec<String> {
    let mut words: Vec<(u32, String)> = model
        .tokenizer()
        .get_vocab(false)
        .into_iter()
        .filter(|(word, _)| word.len() > 3 && word.chars().all(|c| c.is_ascii_lowercase()))
        .map(|(word, id)| (id, word))
        .collect();
    words.sort();
    words
        .into_iter()
        .take(6_000)
        .map(|(_, word)| word)
        .collect()
}
