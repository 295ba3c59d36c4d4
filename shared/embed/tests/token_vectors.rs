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
