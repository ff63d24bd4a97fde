#include "datasets/word_lists.h"

#include <sstream>

namespace kvb {
namespace {

// Common English adjectives and nouns, written out here so that the keys of the needle tasks do not
// depend on a package (RULER draws "adjective-noun" keys from the `wonderwords` lists; these are a
// smaller hand-picked set of the same kind). Changing either list changes every generated key, so
// it is part of the generator version (kSyntheticGeneratorVersion).
const char* const kAdjectives =
    "able absent abundant adorable afraid agreeable alert amused ancient angry anxious aromatic "
    "ashamed average awake awful bad bashful beautiful bent best better bitter black blue "
    "blushing bored brave brief bright brown busy calm careful charming cheerful chilly clean "
    "clever cloudy clumsy cold colorful complete cool crazy creepy crooked cruel curious curly "
    "cute damp dark dazzling dear deep delicate delightful dirty distinct dizzy dry dull dusty "
    "eager early easy elegant empty enchanting energetic equal evil excited expensive fair "
    "faithful famous fancy fantastic fast fierce filthy fine fluffy foolish fragile frail frantic "
    "fresh friendly frightened funny fuzzy gentle giant gifted glamorous gleaming glorious golden "
    "good gorgeous graceful grateful greasy great green grumpy handsome happy harsh healthy heavy "
    "helpful helpless hollow homely honest hot huge humble hungry icy innocent itchy jealous "
    "jittery jolly juicy kind large lazy light little lively lonely long loud lovely lucky "
    "magnificent massive mighty misty modern muddy mysterious narrow nervous new nice noisy "
    "obedient odd old orange ordinary pale perfect plain pleasant polite poor powerful precious "
    "pretty proud purple quaint quick quiet rainy rapid rare red rich rotten rough round royal "
    "rude rusty sad safe salty scary selfish shaggy shallow sharp shiny short shy silly simple "
    "skinny sleepy slow small smooth soft sour sparkling spicy splendid spotless steady sticky "
    "stormy strange strong stupid sturdy successful sweet swift tall tame tasty tender tense "
    "terrible thankful thick thin thirsty thoughtful tidy tiny tired tough ugly uneven unusual "
    "upset vast victorious violet vivid warm wasteful weak wealthy weary wet whispering white "
    "wicked wide wild windy wise witty wonderful wooden worried yellow young zany zealous";
const char* const kNouns =
    "actor airport album angle animal ankle answer apple arch army arrow artist atom baby bag "
    "bakery ball balloon banana band bank barn basket bath beach bean bear bed bee bell belt "
    "bench bicycle bird blanket boat body bone book boot bottle box boy brain branch bread brick "
    "bridge brother brush bubble bucket building butter button cabin cable cake camera camp "
    "candle canoe canvas captain car card carpet castle cat cattle cave chair chalk cheese cherry "
    "chest chicken child chimney church circle city clock cloud coast coat coffee coin college "
    "comb compass cookie corner cottage cow crayon crowd crown cup curtain cushion daisy dance "
    "desert desk diamond dinner doctor dog doll donkey door dragon drawer dream dress drum duck "
    "eagle earth egg elbow elephant engine eye fabric face factory farm father feather fence "
    "field finger fire fish flag flame flower fog forest fork fountain frog fruit garden gate "
    "ghost giraffe girl glass glove goat gold grape grass guitar hall hammer hand harbor hat "
    "heart helmet hill horse hospital hotel house island jacket jelly jewel journey kettle key "
    "kitchen kite knee knife ladder lake lamp leaf lemon letter library lion lizard lock machine "
    "magnet map market meadow melon mirror monkey moon mountain mouse museum needle nest night "
    "ocean office onion orchard oven owl painter palace pancake paper parrot pencil piano picture "
    "pillow pirate planet pocket pond potato puzzle queen rabbit radio rainbow river road robot "
    "rocket roof rose sailor salad sandwich school scissors sea shadow sheep shell ship shoe shop "
    "shovel singer sister skate sky snake song spider spoon square squirrel stadium star station "
    "stone storm street sugar summer sun swan table teacher temple tent theater thunder tiger "
    "toast tower town toy tractor train treasure tree truck trumpet tunnel turtle umbrella valley "
    "vase village violin volcano wagon wall wand watch water wave whale wheel window wing winter "
    "wizard wolf yard zebra";

std::vector<std::string> split_words(const char* text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

}  // namespace

const std::vector<std::string>& key_adjectives() {
  static const std::vector<std::string> kList = split_words(kAdjectives);
  return kList;
}

const std::vector<std::string>& key_nouns() {
  static const std::vector<std::string> kList = split_words(kNouns);
  return kList;
}

}  // namespace kvb
